// Markdown to safe HTML: marked for the syntax, highlight.js for code blocks, DOMPurify so
// model output can never inject script into the page, nor restyle or overlay it.
import { Marked } from 'marked';
import hljs from 'highlight.js/lib/common';
import DOMPurify from 'dompurify';

const marked = new Marked({
  gfm: true,
  breaks: false,
  renderer: {
    code({ text, lang }) {
      const language = lang && hljs.getLanguage(lang) ? lang : null;
      const html = language
        ? hljs.highlight(text, { language, ignoreIllegals: true }).value
        : hljs.highlightAuto(text).value;
      const cls = language ? ` language-${language}` : '';
      return `<pre><code class="hljs${cls}">${html}</code></pre>`;
    },
  },
});

// DOMPurify's defaults allow <style>, style="" and forms: a reply holding
// `<style>body{display:none}</style>` blanked the page (and, kept in the history, every reload
// after it); a `position: fixed` box could cover the page with fake controls; a <form> could post
// what a person types into it off-site (CSP's default-src does not cover form-action).
const purify = DOMPurify();
const PURIFY = {
  FORBID_TAGS: ['style', 'form', 'button', 'textarea', 'select', 'option', 'dialog'],
  FORBID_ATTR: ['style', 'id', 'name', 'tabindex', 'autofocus'],
};
// Classes: only highlight.js's ("hljs-keyword", "language-js", its scopes' "title_"), so that a
// reply cannot borrow the page's own (look like a user turn, or hide itself).
purify.addHook('uponSanitizeAttribute', (node, data) => {
  if (data.attrName !== 'class') return;
  data.attrValue = data.attrValue.split(/\s+/)
    .filter((c) => /^(hljs|language-)|_$/.test(c)).join(' ');
  if (!data.attrValue) data.keepAttr = false;
});

// After sanitizing, in an inert document (images there do not load): links open in a new tab that
// cannot reach back into this page (window.opener); an image from another origin, which the page's
// CSP (img-src 'self' data:) would block, becomes a link to it, so no request is even attempted;
// inputs (a GFM task list's check boxes) cannot be changed.
function finish(html) {
  const doc = new DOMParser().parseFromString(`<body>${html}</body>`, 'text/html');
  for (const a of doc.querySelectorAll('a[href]')) {
    a.setAttribute('target', '_blank');
    a.setAttribute('rel', 'noopener noreferrer');
  }
  for (const img of doc.querySelectorAll('img')) {
    const src = img.getAttribute('src') || '';
    if (sameOriginOrData(src)) continue;
    const link = doc.createElement('a');
    link.setAttribute('href', src);
    link.setAttribute('target', '_blank');
    link.setAttribute('rel', 'noopener noreferrer');
    link.textContent = `[image: ${img.getAttribute('alt') || src}]`;
    img.replaceWith(link);
  }
  for (const input of doc.querySelectorAll('input')) input.setAttribute('disabled', '');
  return doc.body.innerHTML;
}

function sameOriginOrData(src) {
  try {
    const url = new URL(src, window.location.href);
    return url.protocol === 'data:' || url.origin === window.location.origin;
  } catch (_) {
    return false;
  }
}

export function renderMarkdown(text) {
  const markdown = typeof text === 'string' ? text : String(text ?? '');
  return finish(purify.sanitize(marked.parse(markdown), PURIFY));
}
