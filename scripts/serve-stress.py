#!/usr/bin/env python3
"""Stress a running `lragent serve` the way real clients of an OpenAI-compatible server behave,
and check what it answered. Standard library only.

Start a server (tinystories-656k, its plan/action/reflect adapters, the Llama-3 chat template),
then point this at it:

  build/lragent serve --model ../shared/models/tinystories-656k \\
      --adapter plan=$A/plan --adapter action=$A/action --adapter reflect=$A/reflect \\
      --chat-template /tmp/llama3.jinja --port 18200 --max-sessions 4 --kv-share none
  scripts/serve-stress.py --port 18200 [--clients 48] [--rounds 2] [--exact]

(/tmp/llama3.jinja: the "chat_template" of .fixtures/llama3/tokenizer_config.json, which
scripts/fetch-fixtures.sh fetches.)

Phases:
  1. reference: every well-formed request of the storm, sent alone, one after another;
  2. storm: --clients threads send them all at once (streaming and not, completions and chat, the
     base model and each adapter, n > 1, stop strings, seeded sampling, max_tokens up to the
     context, agent chains whose prompts extend each other, more trajectories than
     --max-sessions), beside bad requests (over the context: 400; unknown model: 404; bad JSON:
     400) and misbehaving clients: a stream closed after its first events, half a request then
     a stall, a huge Content-Length then a close, slow readers;
  3. after: nothing running or waiting (/lragent/sessions, /metrics), a new request answered.
With --exact (a --kv-share none server, where every agent's output is its own whatever computed
the cache), every answer must equal its reference; under a sharing mode an agent that reads
another agent's entries may legitimately differ (docs/server.md), so only the requests whose
prompt nobody else sends are compared. Exits 1 when a check fails; prints what failed.

Also worth running: --kv-memory small enough that a trajectory's agents evict each other's caches
(--kv-memory 0.0003 --kv-share none --exact: every answer still equals its reference; requests
longer than the capped max_model_len are refused alone and in the storm alike). With
--no-kv-evict some turns get 400 "does not fit one trajectory's KV memory" depending on which
trajectory they land on, as documented, so --exact does not apply there.
On a GPU server (--device cuda), --exact and the comparisons hold with --dtype f32; in bf16 a
batched pass rounds differently from a request alone, so long outputs may part
(scripts/serve-stress-gpu.sh runs all three on the GPU machine).
Not a CI test: it takes about 15 s a round and judges whole runs (docs/server.md).
"""
import argparse
import http.client
import json
import random
import re
import socket
import sys
import threading
import time

HOST = "127.0.0.1"
FAILS = []
LOCK = threading.Lock()


def fail(msg):
    with LOCK:
        FAILS.append(msg)
        print("FAIL:", msg, flush=True)


def request(port, method, path, body=None, timeout=300):
    c = http.client.HTTPConnection(HOST, port, timeout=timeout)
    data = json.dumps(body) if isinstance(body, (dict, list)) else body
    c.request(method, path, body=data, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    raw = r.read()
    c.close()
    try:
        return r.status, json.loads(raw)
    except ValueError:
        return r.status, raw.decode(errors="replace")


def stream(port, path, body, timeout=300):
    """POSTs a streaming request; returns (status, texts per choice, finish reasons, error event)."""
    c = http.client.HTTPConnection(HOST, port, timeout=timeout)
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        out = r.read()
        c.close()
        return r.status, None, None, out
    texts, reasons, error, done = {}, {}, None, False
    for line in r:
        line = line.decode().rstrip("\n")
        if not line.startswith("data: "):
            continue
        payload = line[6:]
        if payload == "[DONE]":
            done = True
            break
        ev = json.loads(payload)
        if "error" in ev:
            error = ev
            continue
        for ch in ev["choices"]:
            i = ch["index"]
            piece = ch.get("text") if "text" in ch else (ch.get("delta") or {}).get("content")
            texts[i] = texts.get(i, "") + (piece or "")
            if ch.get("finish_reason"):
                reasons[i] = ch["finish_reason"]
    c.close()
    if not done:
        error = error or "no [DONE]"
    return 200, [texts.get(i, "") for i in range(len(texts))], reasons, error


def texts_of(j, chat):
    return [(ch["message"]["content"] or "") if chat else ch["text"] for ch in j["choices"]]


NAMES = ["Lily", "Tom", "Ben", "Sue", "Max", "Mia", "Sam", "Anna", "Tim", "Lucy", "Jack", "Zoe",
         "Bob", "Kate", "Dan", "Amy"]
PLACES = ["park", "garden", "forest", "house", "school", "beach", "farm", "shop"]


def make_requests(base, ctx):
    """The well-formed requests: (key, path, body, unique) where unique means no other request
    sends a prompt sharing a page with it."""
    models = [base, "plan", "action", "reflect"]
    reqs = []
    for k in range(24):
        name, place = NAMES[k % len(NAMES)], PLACES[(k // 2) % len(PLACES)]
        prompt = f"{k} {name} went to the {place} with a big red ball. {name} saw"
        model = models[k % 4]
        body = {"model": model, "prompt": prompt, "max_tokens": [16, 48, 120, 200][k % 4], "temperature": 0}
        if k % 5 == 1:
            body["stop"] = [".", "\n"]
        if k % 6 == 2:
            body["n"] = 3
        if k % 7 == 3:
            body.update(temperature=0.8, seed=1000 + k, top_p=0.9)
            if k % 2:
                body["n"] = 2
        reqs.append((f"cmpl{k}", "/v1/completions", body, True))
    for k in range(8):
        msgs = [{"role": "system", "content": f"You tell story {k}."},
                {"role": "user", "content": f"{NAMES[k]} and {NAMES[k + 8]} found a {PLACES[k]}."}]
        body = {"model": models[k % 4], "messages": msgs, "temperature": 0}
        if k % 3 == 0:
            body["max_tokens"] = 40
        elif k % 3 == 1:
            body["max_completion_tokens"] = 64
        # else: no max_tokens: the rest of the context, as vLLM
        # The template's header is a common prefix of every conversation: not unique.
        reqs.append((f"chat{k}", "/v1/chat/completions", body, False))
    # The same prompt to every model at once (parallel agents on one prompt): shared.
    shared = "Once upon a time there was a little girl named Lily who loved to play outside in the sun"
    for m in models:
        reqs.append((f"fan-{m}", "/v1/completions", {"model": m, "prompt": shared, "max_tokens": 32,
                                                     "temperature": 0}, False))
    # A prompt filling the context: max_tokens up to the end.
    long_prompt = " ".join(f"{NAMES[i % 16]} had a {PLACES[i % 8]}." for i in range(60))
    reqs.append(("long-full", "/v1/completions", {"model": "plan", "prompt": long_prompt, "max_tokens": 64,
                                                  "temperature": 0, "ignore_eos": True}, True))
    # Token prompts at the context: prompt + max_tokens = max_model_len exactly.
    ids = [1] + [(37 * i) % 900 + 50 for i in range(ctx - 2)]
    reqs.append(("at-ctx-1", "/v1/completions", {"model": "action", "prompt": ids, "max_tokens": 1,
                                                 "temperature": 0}, True))
    other = [1] + [(53 * i) % 900 + 60 for i in range(ctx - 65)]  # no common page with `ids`
    reqs.append(("at-ctx-64", "/v1/completions", {"model": "reflect", "prompt": other + [7],
                                                  "max_tokens": 63, "temperature": 0, "ignore_eos": True}, True))
    return reqs


def chain(port, start, models, rounds, seed):
    """An agent conversation: each turn's prompt is the previous prompt + its completion + an
    observation; returns the texts."""
    prompt, out = start, []
    rng = random.Random(seed)
    for r in range(rounds):
        for m in models:
            body = {"model": m, "prompt": prompt, "max_tokens": 24, "temperature": 0, "stop": "\n"}
            st, j = request(port, "POST", "/v1/completions", body)
            if st != 200:
                return None, f"chain turn {r}/{m}: {st} {j}"
            t = j["choices"][0]["text"]
            out.append(t)
            prompt += t + f"\nObservation {r}: {PLACES[rng.randrange(8)]}.\n"
    return out, None


def run_one(port, key, path, body, want_stream):
    b = dict(body)
    chat = path.endswith("chat/completions")
    if want_stream:
        b["stream"] = True
        st, texts, reasons, err = stream(port, path, b)
        if st != 200:
            return st, f"{key} (stream): {st} {err}"
        if err:
            return None, f"{key} (stream): {st} {err}"
        return texts, None
    st, j = request(port, "POST", path, b)
    if st != 200:
        return st, f"{key}: {st} {j}"
    return texts_of(j, chat), None


# --- misbehaving clients ---------------------------------------------------------------------

def raw_post(port, path, body):
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def disconnect_mid_stream(port, k):
    s = socket.create_connection((HOST, port))
    body = {"model": ["plan", "action"][k % 2], "prompt": f"{k} The dog ran", "max_tokens": 256,
            "temperature": 0, "ignore_eos": True, "stream": True, "n": 1 + k % 3}
    if k % 2:
        body = {"model": "reflect", "messages": [{"role": "user", "content": f"{k} Tell a story"}],
                "stream": True, "temperature": 0}
        s.sendall(raw_post(port, "/v1/chat/completions", body))
    else:
        s.sendall(raw_post(port, "/v1/completions", body))
    got = b""
    while got.count(b"data: ") < 2:
        chunk = s.recv(256)
        if not chunk:
            break
        got += chunk
    if k % 3 == 0:  # an abortive close (RST)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    s.close()


def half_request(port, k):
    s = socket.create_connection((HOST, port))
    if k % 2:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Len")
    else:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\": ")
    time.sleep(8)
    s.close()


def huge_length(port, k):
    s = socket.create_connection((HOST, port))
    length = [10**12, 30 << 20, 10**6][k % 3]
    s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n{{\"pro".encode())
    if k % 3 == 0:
        s.settimeout(10)
        try:
            resp = s.recv(4096)
            if b" 413 " not in resp.split(b"\r\n")[0]:
                fail(f"huge Content-Length {length}: {resp[:120]!r}")
        except OSError as e:
            fail(f"huge Content-Length {length}: no answer ({e})")
    s.close()


def slow_reader(port, k, ctx=512):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    s.connect((HOST, port))
    body = {"model": "action", "prompt": f"{k} A slow cat", "max_tokens": ctx * 3 // 4, "temperature": 0,
            "ignore_eos": True, "stream": True, "logprobs": 5, "n": 2}
    s.sendall(raw_post(port, "/v1/completions", body))
    got = b""
    s.settimeout(120)
    while True:
        time.sleep(0.02)
        chunk = s.recv(512)
        if not chunk:
            break
        got += chunk
        if b"data: [DONE]" in got:
            break
    s.close()
    if b"data: [DONE]" not in got:
        fail(f"slow reader {k}: no [DONE] ({len(got)} bytes)")


def bad_requests(port, ctx, k):
    cases = [
        ("/v1/completions", {"model": "plan", "prompt": "a " * (ctx + 20), "max_tokens": 4}, 400),
        ("/v1/completions", {"model": "plan", "prompt": "Once", "max_tokens": ctx}, 400),
        ("/v1/completions", {"model": "nope", "prompt": "Once"}, 404),
        ("/v1/completions", "{\"prompt\": ", 400),
        ("/v1/completions", {"model": "plan", "prompt": [10**9]}, 400),
        ("/v1/chat/completions", {"model": "plan", "messages": [{"role": "user", "content": "a " * (ctx + 5)}]}, 400),
        ("/v1/completions", {"model": "plan", "prompt": "Once", "max_tokens": 4, "stream": True,
                             "prompt_logprobs": 1}, 400),
    ]
    path, body, want = cases[k % len(cases)]
    st, j = request(port, "POST", path, body)
    if st != want or not isinstance(j, dict) or "error" not in j:
        fail(f"bad request {k}: want {want}, got {st} {str(j)[:200]}")


# --- checks after ------------------------------------------------------------------------------

def metric_values(port):
    st, text = request(port, "GET", "/metrics")
    vals = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, v = line.rpartition(" ")
        vals[name] = float(v)
    return vals


def settle(port, timeout=60):
    """Waits until nothing runs or waits; returns the sessions and metrics then."""
    end = time.time() + timeout
    while True:
        st, sess = request(port, "GET", "/lragent/sessions")
        m = metric_values(port)
        running = [s for s in sess["sessions"] if s["running"]]
        busy = m.get("lragent:num_requests_running", 0) + m.get("lragent:num_requests_waiting", 0)
        if (not running and busy == 0) or time.time() > end:
            return sess, m, running, busy
        time.sleep(0.5)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=18200)
    ap.add_argument("--clients", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2, help="storms run one after another")
    ap.add_argument("--chains", type=int, default=8, help="agent conversations at once (> --max-sessions)")
    ap.add_argument("--exact", action="store_true", help="every answer equals its reference (--kv-share none)")
    ap.add_argument("--no-abuse", action="store_true", help="no misbehaving clients")
    args = ap.parse_args()
    port = args.port

    st, models = request(port, "GET", "/v1/models")
    base = models["data"][0]["id"]
    ctx = models["data"][0]["max_model_len"]
    reqs = make_requests(base, ctx)
    chain_models = ["plan", "action", "reflect"]
    chain_starts = [f"Chain {c}: {NAMES[c]} wanted to find the {PLACES[c % 8]} key." for c in range(args.chains)]

    print(f"server {base}, max_model_len {ctx}: {len(reqs)} requests, {args.chains} chains", flush=True)
    t0 = time.time()
    ref = {}
    for key, path, body, unique in reqs:
        texts, err = run_one(port, key, path, body, False)
        if err and texts == 400:  # too long for this server's max_model_len (--kv-memory caps it)
            print("  refused alone, so in the storm too:", err[:160])
        elif err:
            fail("reference " + err)
        ref[key] = texts
    ref_chain = []
    for c, s in enumerate(chain_starts):
        out, err = chain(port, s, chain_models, 2, c)
        if err:
            fail("reference " + err)
        ref_chain.append(out)
    print(f"references: {time.time() - t0:.1f} s", flush=True)

    for rnd in range(args.rounds):
        t0 = time.time()
        jobs = []
        for i in range(args.clients):
            key, path, body, unique = reqs[i % len(reqs)]
            jobs.append(("req", key, path, body, unique, (i // len(reqs) + i + rnd) % 2 == 1))
        for c in range(args.chains):
            jobs.append(("chain", c))
        if not args.no_abuse:
            for k in range(6):
                jobs += [("abuse", disconnect_mid_stream, k), ("abuse", half_request, k),
                         ("abuse", huge_length, k), ("abuse", lambda p, k, ctx=ctx: slow_reader(p, k, ctx), k)]
            for k in range(14):
                jobs.append(("abuse", lambda p, k, ctx=ctx: bad_requests(p, ctx, k), k))
        random.Random(rnd).shuffle(jobs)
        compared = [0]

        def worker(job):
            try:
                if job[0] == "req":
                    _, key, path, body, unique, streaming = job
                    texts, err = run_one(port, key, path, body, streaming)
                    if ref[key] == 400 and texts == 400:
                        return
                    if err:
                        return fail(err)
                    if (args.exact or unique) and ref[key] is not None:
                        with LOCK:
                            compared[0] += 1
                        if texts != ref[key]:
                            fail(f"{key} ({'stream' if streaming else 'whole'}) differs from alone:\n"
                                 f"  got  {texts!r}\n  want {ref[key]!r}")
                elif job[0] == "chain":
                    c = job[1]
                    out, err = chain(port, chain_starts[c], chain_models, 2, c)
                    if err:
                        return fail(err)
                    with LOCK:
                        compared[0] += 1
                    if args.exact and out != ref_chain[c]:
                        fail(f"chain {c} differs from alone:\n  got  {out!r}\n  want {ref_chain[c]!r}")
                else:
                    job[1](port, job[2])
            except Exception as e:  # noqa: BLE001 - a client-side failure is a finding
                fail(f"{job[:2]}: {type(e).__name__}: {e}")

        threads = [threading.Thread(target=worker, args=(j,)) for j in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        alive = [t for t in threads if t.is_alive()]
        if alive:
            fail(f"round {rnd}: {len(alive)} clients still waiting after 600 s (a hang)")
        print(f"round {rnd}: {len(jobs)} clients, {compared[0]} answers compared, {time.time() - t0:.1f} s",
              flush=True)

    sess, m, running, busy = settle(port)
    if running or busy:
        fail(f"after the storm: {len(running)} trajectories running, {busy} requests running/waiting")
    print("sessions after:", [(s["id"], s["running"], s["tokens"]) for s in sess["sessions"]])
    for k in sorted(m):
        if re.match(r"lragent:(num_requests|num_preemptions|trajectories|kv_cache|http_requests_total|request_success)", k):
            print(f"  {k} {m[k]:g}")
    if m.get("lragent:trajectories", 0) > 4096:
        fail("trajectories counter insane")
    # Still answering, and the same as before the storm.
    key, path, body, unique = reqs[0]
    texts, err = run_one(port, key, path, body, False)
    if err or texts != ref[key]:
        fail(f"after the storm: {err or texts!r} against {ref[key]!r}")
    print("FAILED:" if FAILS else "all checks held", len(FAILS))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
