#!/usr/bin/python3
"""Memory leaks of the long-running processes, checked by LeakSanitizer in the plain build.

usage: leak_check.py BIN_DIR FIXTURE_DIR CANARY LSAN_RUNTIME SUPPRESSIONS

`coli serve` and its private `coli-host` are meant to run for days, so a request path that loses
memory must fail a test CI runs, not only the ASan build (scripts/sanitize.sh, too slow for CI).
Every process below runs with LSAN_RUNTIME (GCC's liblsan) preloaded: at its exit LeakSanitizer
reports each allocation nothing points to any more and the process exits non-zero. The children
inherit it, so a report of the private coli-host counts as well (its stderr is the client's).
LSAN_RUNTIME is empty in a build made with -fsanitize=address: ASan checks leaks itself.

The canary (a program that loses one allocation) must be reported first: a check that cannot
see a leak would pass for nothing. Then `coli run` (plain, sampled chat with a JSON schema,
prompt logprobs) and a `coli serve` session: chat, streamed completions with echo and logprobs,
the Responses API (stored, continued, background and cancelled), a forced tool call, bad
requests, a client that leaves in the middle of a stream, and SIGTERM with a stream running.
SUPPRESSIONS is scripts/lsan.supp (third-party libraries only). docs/status/sanitizers.md.
"""
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

LEAK_EXIT = 23


def fail(why):
    print('FAIL:', why)
    sys.exit(1)


def leak_report(text):
    """The first LeakSanitizer report in text (its first 60 lines), or None."""
    at = text.find('LeakSanitizer')
    if at < 0:
        return None
    return '\n'.join(text[max(0, text.rfind('\n', 0, at)):].splitlines()[:60])


class Checker:
    def __init__(self, bin_dir, fixture, runtime, suppressions):
        self.bin_dir, self.fixture = bin_dir, fixture
        self.env = dict(os.environ)
        for var in ('COLI_MODEL', 'COLI_TEMP', 'K3_THINK', 'K3_MAXT'):
            self.env.pop(var, None)
        if runtime:
            self.env['LD_PRELOAD'] = runtime
        else:  # built with ASan: its own leak check, on unless the run turned it off
            asan = self.env.get('ASAN_OPTIONS', '')
            if 'detect_leaks=0' in asan:
                print('SKIP: ASAN_OPTIONS has detect_leaks=0')
                sys.exit(77)
            self.env['ASAN_OPTIONS'] = (asan + ':' if asan else '') + 'detect_leaks=1'
        self.env['LSAN_OPTIONS'] = (f'suppressions={suppressions}:print_suppressions=0:'
                                    f'exitcode={LEAK_EXIT}')
        self.work = tempfile.mkdtemp(prefix='coli_leak_check.')
        self.env['TMPDIR'] = self.work
        self.env['HOME'] = self.work

    def run(self, what, args, expect_rc=0, timeout=240, extra_env=None):
        env = dict(self.env, **(extra_env or {}))
        p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout,
                           errors='replace')
        report = leak_report(p.stderr)
        if report:
            fail(f'{what}: leak reported\n{report}')
        if p.returncode != expect_rc:
            fail(f'{what}: exit {p.returncode}, expected {expect_rc}; stderr:\n{p.stderr[-3000:]}')
        print(f'ok: {what}')
        return p


class Server:
    """A `coli serve` on a free port, its stdout and stderr gathered by threads."""

    def __init__(self, checker, args, extra_env=None):
        env = dict(checker.env, **(extra_env or {}))
        self.proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, errors='replace')
        self.out, self.err = [], []
        self.port = None
        ready = threading.Event()

        def read_out():
            for line in self.proc.stdout:
                self.out.append(line)
                m = re.search(r'listening on http://127\.0\.0\.1:(\d+)', line)
                if m:
                    self.port = int(m.group(1))
                    ready.set()
            ready.set()

        def read_err():
            for line in self.proc.stderr:
                self.err.append(line)

        self.readers = [threading.Thread(target=read_out), threading.Thread(target=read_err)]
        for t in self.readers:
            t.start()
        if not ready.wait(180) or self.port is None:
            self.proc.kill()
            fail('coli serve did not start: ' + ''.join(self.err)[-3000:])

    def request(self, method, path, body=None, expect=200):
        """body: an object sent as JSON, or a str sent as it is."""
        conn = http.client.HTTPConnection('127.0.0.1', self.port, timeout=120)
        if body is not None and not isinstance(body, str):
            body = json.dumps(body)
        conn.request(method, path, body=body,
                     headers={'Content-Type': 'application/json'})
        resp = conn.getresponse()
        data = resp.read().decode('utf-8', 'replace')
        conn.close()
        if resp.status != expect:
            fail(f'{method} {path}: HTTP {resp.status}, expected {expect}: {data[:500]}')
        return data

    def open_stream(self, path, body):
        """Starts a streamed request and reads its first event; the caller closes it."""
        conn = http.client.HTTPConnection('127.0.0.1', self.port, timeout=120)
        conn.request('POST', path, body=json.dumps(body),
                     headers={'Content-Type': 'application/json'})
        resp = conn.getresponse()
        if resp.status != 200:
            fail(f'POST {path} (stream): HTTP {resp.status}')
        if not resp.fp.readline():
            fail(f'POST {path} (stream): no event')
        return conn

    def stop(self, what):
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            fail(f'{what}: still running 120 s after SIGTERM')
        for t in self.readers:
            t.join()
        err = ''.join(self.err)
        report = leak_report(err)
        if report:
            fail(f'{what}: leak reported\n{report}')
        if rc != 0:
            fail(f'{what}: exit {rc} after SIGTERM; stderr:\n{err[-3000:]}')
        print(f'ok: {what}')


def check_canary(checker, canary):
    p = subprocess.run([canary], env=checker.env, capture_output=True, text=True)
    if 'LeakSanitizer has encountered a fatal error' in p.stderr:
        # It stops the process's threads with ptrace, which some containers forbid.
        print('SKIP: LeakSanitizer cannot run here\n' + p.stderr[-1000:])
        sys.exit(77)
    if p.returncode == 0 or 'detected memory leaks' not in p.stderr:
        fail(f'the canary leak was not reported (exit {p.returncode}): the leak check is not '
             f'active, so it would pass for nothing\n{p.stderr[-2000:]}')
    print('ok: the canary leak is reported')


def check_run(checker):
    coli = os.path.join(checker.bin_dir, 'coli')
    model = checker.fixture
    checker.run('coli run', [coli, 'run', '--model', model, 'Hello', '--ngen', '6'])
    schema = os.path.join(checker.work, 'schema.json')
    with open(schema, 'w') as f:
        json.dump({'type': 'object', 'properties': {'n': {'type': 'integer'}},
                   'required': ['n']}, f)
    checker.run('coli run --chat, sampled, --json-schema, --logprobs',
                [coli, 'run', '--model', model, '--chat', 'Hi', '--ngen', '12', '--temperature',
                 '0.8', '--top-k', '20', '--seed', '3', '--json-schema', schema, '--logprobs',
                 '2'])
    with open(schema, 'w') as f:
        json.dump({'type': 'object', 'not_a_keyword': 1}, f)
    checker.run('coli run: an unsupported schema keyword (error path)',
                [coli, 'run', '--model', model, 'Hi', '--ngen', '4', '--json-schema', schema],
                expect_rc=1)


def check_serve(checker):
    coli = os.path.join(checker.bin_dir, 'coli')
    server = Server(checker, [coli, 'serve', '--model', checker.fixture, '--port', '0',
                              '--workers', '2'], extra_env={'COLI_DECODE_DELAY_MS': '2'})
    model = 'k3_tiny'
    chat = {'model': model, 'messages': [{'role': 'user', 'content': 'Hi'}], 'max_tokens': 6}
    server.request('POST', '/v1/chat/completions', chat)
    server.request('POST', '/v1/chat/completions', dict(chat, stream=True, logprobs=True,
                                                       top_logprobs=2))
    server.request('POST', '/v1/completions', {'model': model, 'prompt': ['a b', 'c'], 'n': 2,
                                               'max_tokens': 4, 'echo': True, 'logprobs': 2,
                                               'stream': True})
    server.request('POST', '/v1/completions', {'model': model, 'prompt': 'x y z',
                                               'max_tokens': 3, 'prompt_logprobs': 2})
    server.request('POST', '/v1/chat/completions', dict(
        chat, max_tokens=40,
        response_format={'type': 'json_schema', 'json_schema': {'name': 's', 'schema': {
            'type': 'object', 'properties': {'a': {'type': 'integer'}}, 'required': ['a']}}}))
    server.request('POST', '/v1/chat/completions', dict(
        chat, max_tokens=60, tool_choice='required',
        tools=[{'type': 'function', 'function': {'name': 'f', 'parameters': {
            'type': 'object', 'properties': {'a': {'type': 'integer'}}, 'required': ['a']}}}]))
    first = json.loads(server.request('POST', '/v1/responses', {
        'model': model, 'input': 'Hi', 'max_output_tokens': 5}))
    server.request('POST', '/v1/responses', {'model': model, 'input': 'more',
                                             'previous_response_id': first['id'],
                                             'max_output_tokens': 5, 'stream': True})
    background = json.loads(server.request('POST', '/v1/responses', {
        'model': model, 'input': 'Hi', 'max_output_tokens': 100000, 'background': True}))
    server.request('POST', f'/v1/responses/{background["id"]}/cancel')
    server.request('DELETE', f'/v1/responses/{first["id"]}')
    server.request('POST', '/v1/chat/completions', dict(chat, temperature=7), expect=400)
    server.request('POST', '/v1/chat/completions', '{"model":', expect=400)
    server.request('GET', '/v1/models')
    server.request('GET', '/metrics')
    # A client that leaves during a stream: the request is cancelled at the host.
    server.open_stream('/v1/chat/completions', dict(chat, max_tokens=100000,
                                                    stream=True)).close()
    # SIGTERM while a stream runs: it ends, the server and its private host exit.
    running = server.open_stream('/v1/completions', {'model': model, 'prompt': 'go',
                                                     'max_tokens': 100000, 'stream': True})
    server.stop('coli serve and its private coli-host, SIGTERM with a stream running')
    running.close()


def main():
    if len(sys.argv) != 6:
        fail(__doc__.splitlines()[2])
    bin_dir, fixture, canary, runtime, suppressions = sys.argv[1:]
    checker = Checker(bin_dir, fixture, runtime, suppressions)
    try:
        check_canary(checker, canary)
        check_run(checker)
        check_serve(checker)
    finally:
        subprocess.run(['rm', '-rf', checker.work])
    print('PASS')


if __name__ == '__main__':
    main()
