#!/usr/bin/env python3
"""Independent reference for common/grammar: Python's json module plus python3-jsonschema.

Usage: grammar_ref.py CASES.json > VERDICTS.json

CASES.json: {"seed": int, "cases": [{"name": str, "schema": {...}, "walks": [hex, ...]}]}
  walks: documents the C++ matcher produced by random walks (bytes as hex).
Output: {"cases": [{"name": str,
                    "walk_errors": [str, ...],   # one line per walk the reference refuses
                    "valid": [hex, ...],         # instances the reference accepts, serialised
                                                 # in schema key order, compact / ", " ": " /
                                                 # indent=2 / ASCII-escaped
                    "invalid": [hex, ...]}]}     # mutations of those the reference refuses

Instances are generated here from the schema by this script's own reading of JSON Schema
(not from the C++ grammar), and every generated instance is checked with jsonschema before
it is used.
"""
import json
import random
import re
import sys

import jsonschema

ALPHABET = ['a', 'b', 'Z', '0', ' ', '"', '\\', '/', '\n', '\t', '\u0001', '\u00e9', '\u20ac',
            '\U0001F600', '\u4e2d', '\u007f']


class Generator:
    def __init__(self, root, rng):
        self.root = root
        self.rng = rng

    def resolve(self, ref):
        node = self.root
        for part in ref[2:].split('/') if ref != '#' else []:
            part = part.replace('~1', '/').replace('~0', '~')
            node = node[int(part)] if isinstance(node, list) else node[part]
        return node

    def gen(self, s, depth=0):
        r = self.rng
        if s is True or s == {}:
            return self.any_value(depth)
        if 'nullable' in s and s['nullable'] and r.random() < 0.2:
            return None
        if '$ref' in s:
            return self.gen(self.resolve(s['$ref']), depth + 1)
        if 'allOf' in s:
            return self.gen(s['allOf'][0], depth)
        for key in ('anyOf', 'oneOf'):
            if key in s:
                alts = s[key]
                if depth > 4:  # prefer alternatives that do not recurse
                    flat = [a for a in alts if '$ref' not in json.dumps(a)]
                    alts = flat or alts
                return self.gen(r.choice(alts), depth + 1)
        if 'const' in s:
            return s['const']
        if 'enum' in s:
            return r.choice(s['enum'])
        types = s.get('type')
        if types is None:
            if 'properties' in s or 'additionalProperties' in s or 'required' in s:
                types = 'object'
            elif 'items' in s or 'prefixItems' in s:
                types = 'array'
            elif 'minLength' in s or 'maxLength' in s or 'pattern' in s:
                types = 'string'
            elif any(k in s for k in BOUNDS):
                types = 'integer'
            else:
                return self.any_value(depth)
        t = r.choice(types) if isinstance(types, list) else types
        if t == 'object':
            return self.gen_object(s, depth)
        if t == 'array':
            return self.gen_array(s, depth)
        if t == 'string' and ('pattern' in s or 'format' in s):
            return self.matching_string(s)
        if t == 'string':
            lo = s.get('minLength', 0)
            hi = min(s.get('maxLength', lo + 6), lo + 6)
            return self.string(r.randint(lo, hi))
        if t == 'integer' or (t == 'number' and any(k in s for k in BOUNDS)):
            lo, hi = integer_bounds(s)
            if t == 'number' and r.random() < 0.6:
                # A decimal (3 places: json.dumps spells it without an exponent) in range.
                v = jsonschema.Draft202012Validator(s)
                a = s.get('minimum', s.get('exclusiveMinimum', -1000))
                b = s.get('maximum', s.get('exclusiveMaximum', 1000))
                for _ in range(20):
                    x = round(r.uniform(a, b), 3)
                    if v.is_valid(x):
                        return x
            if lo is not None or hi is not None:
                lo = -10**6 if lo is None else lo
                hi = 10**6 if hi is None else hi
                return r.choice([lo, hi, r.randint(lo, hi), min(max(0, lo), hi)])
            return r.choice([0, -1, 7, 12345678901234, -42, r.randint(-10**6, 10**6)])
        if t == 'number':
            return r.choice([0, -0.0, 1.5, -2.25e-7, 3e20, 0.1 + 0.2, r.uniform(-1e3, 1e3),
                             r.randint(-99, 99)])
        if t == 'boolean':
            return r.random() < 0.5
        return None

    def matching_string(self, s):
        """A string valid for a pattern / format schema: one of its examples or a random
        candidate that this subschema's validator accepts (re.search + FormatChecker)."""
        v = jsonschema.Draft202012Validator(s, format_checker=FORMATS)
        pool = list(s.get('examples', []))
        pool += [self.string(self.rng.randint(0, 6)) for _ in range(20)]
        # Only values spelled without escapes (no '"', '\\' or control characters): the
        # matcher's documented reading of pattern strings.
        # The matcher's class shorthands are ASCII-only (a subset of Python's Unicode ones):
        # for patterns using them, only ASCII candidates are expected to be accepted.
        ascii_only = re.search(r'\\[wWdDsS]', s.get('pattern', '')) is not None
        ok = [x for x in pool if v.is_valid(x) and not any(c in x for c in '"\\')
              and all(ord(c) >= 0x20 for c in x) and (not ascii_only or x.isascii())]
        return self.rng.choice(ok) if ok else pool[0]

    def string(self, n):
        return ''.join(self.rng.choice(ALPHABET) for _ in range(n))

    def gen_object(self, s, depth):
        r = self.rng
        props = s.get('properties', {})
        required = set(s.get('required', []))
        out = {}
        for name, sub in props.items():
            if name in required or (depth < 4 and r.random() < 0.6):
                out[name] = self.gen(sub, depth + 1)
        extra = s.get('additionalProperties', True if not props else False)
        if extra is not False and depth < 4:
            for _ in range(r.randint(0, 2)):
                name = self.string(r.randint(0, 4))
                if name not in props and name not in out:
                    out[name] = self.gen(extra, depth + 1)
        return out

    def gen_array(self, s, depth):
        r = self.rng
        prefix = s.get('prefixItems', [])
        items = s.get('items', True)
        lo = s.get('minItems', 0)
        hi = s.get('maxItems', lo + 3)
        if items is False:
            hi = min(hi, len(prefix))
        n = r.randint(lo, min(hi, lo + 3)) if depth < 4 else lo
        return [self.gen(prefix[i] if i < len(prefix) else items, depth + 1) for i in range(n)]

    def any_value(self, depth):
        r = self.rng
        kinds = ['str', 'int', 'float', 'bool', 'null'] + (['obj', 'arr'] if depth < 3 else [])
        k = r.choice(kinds)
        if k == 'obj':
            return {self.string(r.randint(0, 3)): self.any_value(depth + 1)
                    for _ in range(r.randint(0, 3))}
        if k == 'arr':
            return [self.any_value(depth + 1) for _ in range(r.randint(0, 3))]
        return {'str': lambda: self.string(r.randint(0, 4)), 'int': lambda: r.randint(-999, 999),
                'float': lambda: r.uniform(-10, 10), 'bool': lambda: r.random() < 0.5,
                'null': lambda: None}[k]()


BOUNDS = ('minimum', 'maximum', 'exclusiveMinimum', 'exclusiveMaximum')


def integer_bounds(s):
    """The integer interval [lo, hi] (None: open) the bounds of s allow."""
    import math
    lo = hi = None
    if 'minimum' in s:
        lo = math.ceil(s['minimum'])
    if 'exclusiveMinimum' in s:
        b = math.floor(s['exclusiveMinimum']) + 1
        lo = b if lo is None else max(lo, b)
    if 'maximum' in s:
        hi = math.floor(s['maximum'])
    if 'exclusiveMaximum' in s:
        b = math.ceil(s['exclusiveMaximum']) - 1
        hi = b if hi is None else min(hi, b)
    return lo, hi


# Draft 2020-12's format checkers (FormatChecker() mixes in draft 3's "time" = %H:%M:%S).
FORMATS = jsonschema.FormatChecker(formats=())
FORMATS.checkers = dict(jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers)
if 'hostname' not in FORMATS.checkers:  # jsonschema checks hostnames only with python3-fqdn
    @FORMATS.checks('hostname')
    def is_hostname(value):
        """RFC 1123 host name: dot-separated labels of 1-63 letters, digits and hyphens, not
        starting or ending with a hyphen, 253 characters at most."""
        if not isinstance(value, str):
            return True
        if len(value) > 253:
            return False
        allowed = set('abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-')
        return all(0 < len(label) <= 63 and set(label) <= allowed and label[0] != '-'
                   and label[-1] != '-' for label in value.split('.'))


def is_rfc3339_time(value):
    """RFC 3339 full-time: HH:MM:SS, optional fraction, then Z or +-HH:MM (Python's
    datetime.time.fromisoformat judges the values)."""
    import datetime
    if not isinstance(value, str):
        return True
    v = value.upper()
    if v.endswith('Z'):
        main, offset = v[:-1], '+00:00'
    elif len(v) > 6 and v[-6] in '+-' and v[-3] == ':':
        main, offset = v[:-6], v[-6:]
    else:
        return False
    if len(main) < 8 or main[2] != ':' or main[5] != ':' or not main[:8].replace(':', '').isdigit():
        return False
    if len(main) > 8 and (main[8] != '.' or not main[9:].isdigit() or len(main) == 9):
        return False
    try:
        datetime.time.fromisoformat(main[:15] + offset)
        return int(offset[1:3]) < 24 and int(offset[4:6]) < 60
    except ValueError:
        return False


def is_rfc3339_date_time(value):
    import datetime
    if not isinstance(value, str):
        return True
    date, sep, time = value.upper().partition('T')
    if not sep or len(date) != 10:
        return False
    try:
        datetime.date.fromisoformat(date)
    except ValueError:
        return False
    return is_rfc3339_time(time)


# Debian's python3-jsonschema checks time / date-time only with rfc3339-validator (not
# packaged) and hostname only with fqdn: these stand in for them where they are missing.
for _name, _check in (('time', is_rfc3339_time), ('date-time', is_rfc3339_date_time)):
    if _name not in FORMATS.checkers:
        FORMATS.checks(_name)(_check)


def accepts(validator, text):
    """Whether the reference accepts the text: strict JSON, valid UTF-8, no lone surrogate,
    and valid under the schema."""
    try:
        value = json.loads(text)
        json.dumps(value, ensure_ascii=False).encode('utf-8')  # refuses lone surrogates
    except (ValueError, UnicodeError, RecursionError):
        return False
    return validator.is_valid(value)


def mutate(text, rng):
    chars = ['{', '}', '[', ']', ',', ':', '"', '0', '1', '-', '.', 'e', ' ', 'a', '\\', '\n',
             '\t', 'x', 'n', '\u00e9']
    i = rng.randrange(len(text) + 1)
    op = rng.randrange(4)
    if op == 0 and i < len(text):
        return text[:i] + text[i + 1:]
    if op == 1:
        return text[:i] + rng.choice(chars) + text[i:]
    if op == 2 and i < len(text):
        return text[:i] + rng.choice(chars) + text[i + 1:]
    if i + 1 < len(text):
        return text[:i] + text[i + 1] + text[i] + text[i + 2:]
    return text + rng.choice(chars)


def main():
    with open(sys.argv[1], encoding='utf-8') as f:
        spec = json.load(f)
    rng = random.Random(spec.get('seed', 1))
    out = []
    for case in spec['cases']:
        schema = case['schema']
        validator = jsonschema.Draft202012Validator(schema, format_checker=FORMATS)
        errors = []
        for h in case['walks']:
            raw = bytes.fromhex(h)
            try:
                text = raw.decode('utf-8')
            except UnicodeDecodeError as e:
                errors.append('not UTF-8 (%s): %r' % (e, raw))
                continue
            if not accepts(validator, text):
                try:
                    why = next(iter(validator.iter_errors(json.loads(text)))).message
                except (ValueError, StopIteration) as e:
                    why = str(e) or 'not strict JSON / lone surrogate'
                errors.append('%r: %s' % (text, why))
        gen = Generator(schema, rng)
        valid, invalid = [], []
        for _ in range(case.get('instances', 40)):
            value = gen.gen(schema)
            if not validator.is_valid(value):
                errors.append('generator made an invalid instance %r' % (value,))
                continue
            forms = [json.dumps(value, ensure_ascii=False, separators=(',', ':')),
                     json.dumps(value, ensure_ascii=False),
                     json.dumps(value, ensure_ascii=False, indent=2)]
            # Pattern / format strings take unescaped characters only (docs/status/grammar.md):
            # their ASCII-escaped form is no reference-valid spelling the matcher must accept.
            if not case.get('unescaped_only'):
                forms.append(json.dumps(value, ensure_ascii=True, separators=(',', ':')))
            valid.extend(x.encode('utf-8').hex() for x in forms)
            for _ in range(6):
                m = mutate(forms[rng.randrange(2)], rng)
                if not accepts(validator, m):
                    invalid.append(m.encode('utf-8', 'surrogatepass').hex())
        out.append({'name': case['name'], 'walk_errors': errors, 'valid': valid,
                    'invalid': invalid})
    json.dump({'cases': out}, sys.stdout)


if __name__ == '__main__':
    main()
