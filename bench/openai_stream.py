"""Streams completions from a NeuroShard node with the official `openai` client.

Usage: python bench/openai_stream.py BASE_URL [--concurrency 1,8,32] [--max-tokens 32]
  BASE_URL is what `neuroshard swarm` prints, e.g. http://127.0.0.1:41234/v1

First one streamed completion, printed as it arrives (the client check); then, for each
concurrency level, that many streams at once: time to first token and tokens/s per stream
(tokens after the first over the time after the first, one server-sent event per token), medians over the streams.
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
    a = p.parse_args()
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


if __name__ == "__main__":
    sys.exit(main())
