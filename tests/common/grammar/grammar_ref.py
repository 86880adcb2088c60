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
            elif 'minLength' in s or 'maxLength' in s:
                types = 'string'
            else:
                return self.any_value(depth)
        t = r.choice(types) if isinstance(types, list) else types
        if t == 'object':
            return self.gen_object(s, depth)
        if t == 'array':
            return self.gen_array(s, depth)
        if t == 'string':
            lo = s.get('minLength', 0)
            hi = min(s.get('maxLength', lo + 6), lo + 6)
            return self.string(r.randint(lo, hi))
        if t == 'integer':
            return r.choice([0, -1, 7, 12345678901234, -42, r.randint(-10**6, 10**6)])
        if t == 'number':
            return r.choice([0, -0.0, 1.5, -2.25e-7, 3e20, 0.1 + 0.2, r.uniform(-1e3, 1e3),
                             r.randint(-99, 99)])
        if t == 'boolean':
            return r.random() < 0.5
        return None

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
        validator = jsonschema.Draft202012Validator(schema)
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
                     json.dumps(value, ensure_ascii=False, indent=2),
                     json.dumps(value, ensure_ascii=True, separators=(',', ':'))]
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
