// Markdown to safe HTML: marked for the syntax, highlight.js for code blocks, DOMPurify so
// model output can never inject script into the page.
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

export function renderMarkdown(text) {
  return DOMPurify.sanitize(marked.parse(text || ''));
}
