"""Streams completions from a NeuroShard node with the official `openai` client.

Usage: python bench/openai_stream.py BASE_URL [--concurrency 1,8,32] [--max-tokens 32]
  BASE_URL is what `neuroshard swarm` prints, e.g. http://127.0.0.1:41234/v1

First one streamed completion, printed as it arrives (the client check); then, for each
concurrency level, that many streams at once: time to first token and tokens/s per stream
(tokens after the first over the time after the first, one server-sent event per token), medians over the streams.

With --soak SECONDS: --clients N clients each open streams one after another for that long;
exits non-zero if any stream raised or ended without a finish reason, or no token came at all.
"""

import argparse
import statistics
import sys
import threading
import time

from openai import OpenAI


def one_stream(client, prompt, max_tokens, seed, out):
    start = time.perf_counter()
    first = None
    pieces = 0
    text = []
    finish = None
    stream = client.completions.create(
        model="neuroshard",
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0.8,
        top_p=0.95,
        seed=seed,
        stream=True,
    )
    for chunk in stream:
        choice = chunk.choices[0]
        text.append(choice.text)
        # The node sends one event per token (its text may be empty while a character or a
        # possible stop string is incomplete) and a last one with the finish reason.
        if choice.finish_reason:
            finish = choice.finish_reason
            continue
        pieces += 1
        if first is None:
            first = time.perf_counter()
    end = time.perf_counter()
    out.append(
        {
            "ttft": (first or end) - start,
            "pieces": pieces,
            "rate": (pieces - 1) / (end - first) if first and end > first and pieces > 1 else 0.0,
            "text": "".join(text),
            "finish": finish,
        }
    )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("base_url")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--prompt", default="The ")
    p.add_argument("--soak", type=float, default=0.0)
    p.add_argument("--clients", type=int, default=50)
    a = p.parse_args()
    if a.soak > 0:
        return soak(a)
    client = OpenAI(base_url=a.base_url, api_key="none", max_retries=0, timeout=600)
    print("models:", [m.id for m in client.models.list().data])
    print("streaming: ", end="", flush=True)
    stream = client.completions.create(
        model="neuroshard", prompt=a.prompt, max_tokens=a.max_tokens, seed=7, stream=True
    )
    finish = None
    for chunk in stream:
        print(chunk.choices[0].text, end="", flush=True)
        finish = chunk.choices[0].finish_reason or finish
    print(f"\n[finish_reason: {finish}]")
    # Same seed, same tokens: two non-streamed calls agree.
    a1 = client.completions.create(model="neuroshard", prompt=a.prompt, max_tokens=8, seed=3)
    a2 = client.completions.create(model="neuroshard", prompt=a.prompt, max_tokens=8, seed=3)
    print("seed 3 twice equal:", a1.choices[0].text == a2.choices[0].text)
    print("streams | median TTFT s | median tokens/s per stream | aggregate tokens/s | errors")
    for n in [int(x) for x in a.concurrency.split(",")]:
        out, threads = [], []
        t0 = time.perf_counter()
        for i in range(n):
            t = threading.Thread(target=one_stream, args=(client, a.prompt, a.max_tokens, i, out))
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        errors = n - len(out)
        ttft = statistics.median(r["ttft"] for r in out) if out else float("nan")
        rate = statistics.median(r["rate"] for r in out) if out else float("nan")
        total = sum(r["pieces"] for r in out) / wall
        print(f"{n:7} | {ttft:13.3f} | {rate:26.1f} | {total:18.1f} | {errors}")
    return 0


def soak(a):
    client = OpenAI(base_url=a.base_url, api_key="none", max_retries=0, timeout=120)
    deadline = time.perf_counter() + a.soak
    done, errors, lock = [], [], threading.Lock()

    def client_loop(k):
        seed = k * 1000
        while time.perf_counter() < deadline:
            out = []
            try:
                one_stream(client, a.prompt, a.max_tokens, seed, out)
            except Exception as e:  # every failure counts; the message says which
                with lock:
                    errors.append(f"client {k}: {type(e).__name__}: {e}")
                continue
            seed += 1
            r = out[0]
            with lock:
                # A stream may end at once on the end-of-text token (finish "stop"): the
                # tiny CI model draws it often; only a stream without a finish is broken.
                if r["finish"] is None:
                    errors.append(f"client {k}: no finish reason after {r['pieces']} tokens")
                else:
                    done.append(r)

    threads = [threading.Thread(target=client_loop, args=(k,)) for k in range(a.clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    tokens = sum(r["pieces"] for r in done)
    ttft = statistics.median(r["ttft"] for r in done) if done else float("nan")
    print(
        f"soak: {a.clients} clients for {wall:.1f} s: {len(done)} streams, {tokens} tokens "
        f"({tokens / wall:.1f}/s), median TTFT {ttft:.3f} s, {len(errors)} errors"
    )
    for e in errors[:10]:
        print("  error:", e)
    return 1 if errors or tokens == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
