// Helpers shared by the grpc-js suites.
import assert from 'node:assert/strict';

// Polls `pred` (async) until it holds, for at most `guardMs`; a hang guard, not a timing assertion.
export async function waitFor(pred, what, guardMs) {
  const until = Date.now() + guardMs;
  while (Date.now() < until) {
    if (await pred()) return;
    await new Promise((r) => setTimeout(r, 20));
  }
  assert.fail(`timed out waiting for ${what}`);
}
