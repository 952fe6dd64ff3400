#!/usr/bin/python3
"""Check `lragent replay` against the independent numpy reference (reference_replay.py).

For every KV sharing mode (none, full, base, base-lr, droidspeak with --recompute-layers 1, 0 and 0,1)
and every adapter set of tinystories-656k, a replay script is built from a real agent trajectory
(data/agent-trajectories/13b_hotpotqa_200.json: prompt, Thought/Action/Observation turns), run by
both implementations, and compared:
  - per agent step: agent, prefilled_tokens and output_tokens identical,
  - every logits row (one per decoded or forced token) within --tol (max abs diff),
  - cache base/lr/full/total bytes equal to the reference's analytic count.
Plus: base-lr with independent-A adapters and droidspeak with an out-of-range recompute layer must
fail with a clear message, and some invariants of the reference itself (none == uncached HF forward,
droidspeak with every layer recomputed == none).

Usage: check_replay.py --lragent BUILD/lragent --shared ../shared
Exit status 0 when everything passed.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_replay as ref  # noqa: E402

ADAPTER_SETS = ("qv-shared-a-r8", "qv-indep-a-r8", "qkvo-shared-a-r4")
AGENTS = ("plan", "action", "reflect")
# (label, --kv-share, --recompute-layers)
MODE_CASES = (
    ("none", "none", ""),
    ("full", "full", ""),
    ("base", "base", ""),
    ("base-lr", "base-lr", ""),
    ("droidspeak[1]", "droidspeak", "1"),
    ("droidspeak[0]", "droidspeak", "0"),
    ("droidspeak[0,1]", "droidspeak", "0,1"),
)
MAX_TRAJ = 400


# ----------------------------------------------------------------------------- script from a trajectory

class Tokenizer:
    def __init__(self, lragent, model_dir):
        self.lragent, self.model_dir = lragent, model_dir
        self.cache = {}

    def __call__(self, text):
        if text not in self.cache:
            p = subprocess.run([self.lragent, "tokenize", "--model", self.model_dir, "--text", text, "--json",
                                "--no-special"], capture_output=True, text=True)
            if p.returncode != 0:
                raise RuntimeError(f"lragent tokenize failed ({p.returncode}): {p.stderr.strip()}")
            self.cache[text] = json.loads(p.stdout)["ids"]
        return self.cache[text]


TURN_RE = re.compile(r"^(Thought|Action|Observation) (\d+): ?(.*)$")


def parse_trajectory(entry):
    """Instruction head, question line and the list of (kind, n, text) turns of one ReAct trajectory."""
    prompt = entry["prompt"]
    qpos = prompt.index("Question:")
    head = prompt[:qpos]
    rest = prompt[qpos:].split("\n")
    question = rest[0]
    turns = []
    for line in rest[1:]:
        mt = TURN_RE.match(line)
        if mt:
            turns.append((mt.group(1), int(mt.group(2)), line))
        elif turns and line.strip():
            k, n, t = turns[-1]
            turns[-1] = (k, n, t + "\n" + line)
    return head, question, turns


def pick_entry(entries):
    for i, e in enumerate(entries):
        try:
            _, _, turns = parse_trajectory(e)
        except ValueError:
            continue
        kinds = [k for k, _, _ in turns]
        if kinds.count("Thought") >= 4 and kinds.count("Action") >= 3 and kinds.count("Observation") >= 3:
            return i
    raise RuntimeError("no trajectory with enough Thought/Action/Observation turns")


def build_script(tok, traj_file, entry_index=None):
    entries = json.load(open(traj_file))
    idx = pick_entry(entries) if entry_index is None else entry_index
    head, question, turns = parse_trajectory(entries[idx])
    by = {}
    for k, n, t in turns:
        by.setdefault((k, n), t)

    def piece(text, budget):
        return tok(text + "\n")[:budget]

    first_sentence = head.split(",")[0].strip()
    prompt = piece(first_sentence + ".\n" + question, 64)
    th = lambda n, b=22: piece(by.get(("Thought", n), f"Thought {n}:"), b)
    ac = lambda n, b=16: piece(by.get(("Action", n), f"Action {n}:"), b)
    ob = lambda n, b=30: piece(by.get(("Observation", n), f"Observation {n}:"), b)
    steps = [
        {"append_tokens": prompt},
        {"agent": "plan", "generate": 6},
        {"agent": "plan", "force_tokens": th(1)},          # same agent again: catches up on 1 token
        {"agent": "action", "generate": 5},
        {"agent": "action", "force_tokens": ac(1)},
        {"append_tokens": ob(1)},
        {"agent": "reflect", "generate": 4},
        {"agent": "plan", "force_tokens": th(2)},
        {"agent": "action", "generate": 8},
        {"agent": "action", "force_tokens": ac(2)},
        {"append_tokens": ob(2)},
        {"agent": "reflect", "force_tokens": th(3)},
        {"agent": "plan", "generate": 6},
        {"agent": "action", "force_tokens": ac(3)},
        {"append_tokens": ob(3)},
        {"agent": "reflect", "generate": 7},
        {"agent": "reflect", "force_tokens": th(4, 14) + ac(4, 10)},
        {"agent": "plan", "generate": 4},
        {"agent": "action", "generate": 5},
        {"agent": "reflect", "force_tokens": [1]},        # BOS id forced mid-trajectory: a plain token here
    ]
    total = 1 + sum(len(s.get("append_tokens", s.get("force_tokens", []))) + s.get("generate", 0) for s in steps)
    assert total <= MAX_TRAJ, f"trajectory of {total} tokens exceeds {MAX_TRAJ}"
    n_agent = sum(1 for s in steps if "agent" in s)
    return {"steps": steps}, {"entry": idx, "tokens": total, "agent_steps": n_agent}


# ----------------------------------------------------------------------------- running

def run_lragent(args, aset, mode, rl, script_path):
    adir = os.path.join(args.shared, "adapters", "tinystories-656k", aset)
    cmd = [args.lragent, "replay", "--model", args.model]
    for a in AGENTS:
        cmd += ["--adapter", f"{a}={os.path.join(adir, a)}"]
    cmd += ["--kv-share", mode]
    if rl:
        cmd += ["--recompute-layers", rl]
    cmd += ["--script", script_path, "--json", "--logits"]
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p, time.time() - t


def compare(lr_json, ref_res, tol):
    """List of problems (empty when lragent agrees with the reference) and the max logit difference."""
    problems = []
    maxd = 0.0
    ls, rs = lr_json.get("steps", []), ref_res["steps"]
    if len(ls) != len(rs):
        problems.append(f"{len(ls)} agent steps in lragent's output, {len(rs)} in the reference")
    for i, (a, b) in enumerate(zip(ls, rs)):
        tag = f"step {i} ({b['agent']})"
        if a.get("agent") != b["agent"]:
            problems.append(f"{tag}: agent {a.get('agent')!r} != {b['agent']!r}")
        if a.get("prefilled_tokens") != b["prefilled_tokens"]:
            problems.append(f"{tag}: prefilled_tokens lragent {a.get('prefilled_tokens')} ref {b['prefilled_tokens']}")
        lt = a.get("output_tokens")
        if lt != b["output_tokens"]:
            j = next((k for k, (x, y) in enumerate(zip(lt or [], b["output_tokens"])) if x != y), None)
            extra = ""
            if j is not None and j < len(b["logits"]):
                row = b["logits"][j]
                srt = np.sort(row)
                extra = (f"; first difference at token {j}: ref top-2 gap {srt[-1] - srt[-2]:.3g}, "
                         f"ref logit of lragent's token {row[lt[j]]:.6f} vs ref's {row[b['output_tokens'][j]]:.6f}")
            problems.append(f"{tag}: output_tokens lragent {lt} ref {b['output_tokens']}{extra}")
            break  # the trajectories diverge from here on
        la = a.get("logits") or []
        if len(la) != len(b["logits"]):
            problems.append(f"{tag}: {len(la)} logits rows, reference {len(b['logits'])}")
        fl = a.get("first_logits")
        if b["logits"] and (fl is None or not np.array_equal(np.asarray(fl), np.asarray(la[0] if la else []))):
            problems.append(f"{tag}: first_logits is not logits[0]")
        for r, (x, y) in enumerate(zip(la, b["logits"])):
            x = np.asarray(x, dtype=np.float64)
            if x.shape != y.shape:
                problems.append(f"{tag}: logits row {r} has {x.shape[0]} values, reference {y.shape[0]}")
                continue
            d = float(np.max(np.abs(x - y)))
            maxd = max(maxd, d)
            if not d <= tol:
                problems.append(f"{tag}: logits row {r} max abs diff {d:.3g} > {tol} "
                                f"(worst id {int(np.argmax(np.abs(x - y)))})")
    lc = lr_json.get("cache", {})
    for k, v in ref_res["cache"].items():
        if lc.get(k) != v:
            problems.append(f"cache {k}: lragent {lc.get(k)} analytic {v}")
    return problems, maxd


def vs_none(res, none_res):
    """Agreement of a (reference) run with the none run of the same script: fraction of agent steps with
    identical output tokens, and the max logit deviation over steps before the first divergence."""
    same, total, dev, diverged = 0, 0, 0.0, False
    for a, b in zip(res["steps"], none_res["steps"]):
        total += 1
        if a["output_tokens"] == b["output_tokens"]:
            same += 1
        if not diverged:
            for x, y in zip(a["logits"], b["logits"]):
                dev = max(dev, float(np.max(np.abs(x - y))))
            diverged = a["output_tokens"] != b["output_tokens"]
    return same, total, dev


def min_gap(res, script):
    """Smallest top-2 logit gap of the reference over greedily decoded tokens (how close argmax came to a tie)."""
    gaps = []
    agent_steps = [st for st in script["steps"] if "agent" in st]
    for st, s in zip(agent_steps, res["steps"]):
        if "generate" in st:
            for row in s["logits"]:
                top = np.partition(row, -2)[-2:]
                gaps.append(float(top[1] - top[0]))
    return min(gaps) if gaps else float("nan")


class Tally:
    def __init__(self):
        self.passed, self.failed, self.failures = 0, 0, []

    def check(self, name, ok, detail=""):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            self.failures.append(f"{name}: {detail}")
            print(f"FAIL {name}: {detail}", flush=True)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lragent", default=os.path.join(repo, "build", "lragent"))
    ap.add_argument("--shared", default=os.environ.get("LRAGENT_SHARED", os.path.join(os.path.dirname(repo), "shared")))
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--sets", default=",".join(ADAPTER_SETS))
    ap.add_argument("--modes", nargs="*", default=[m for m, _, _ in MODE_CASES],
                    help="mode labels to run: " + " ".join(m for m, _, _ in MODE_CASES))
    ap.add_argument("--entry", type=int, default=None, help="trajectory entry (default: first with enough turns)")
    ap.add_argument("--workdir", default=None, help="keep the script and lragent's JSON outputs here")
    args = ap.parse_args()
    args.model = os.path.join(args.shared, "models", "tinystories-656k")
    t0 = time.time()
    for p in (args.lragent, args.model):
        if not os.path.exists(p):
            print(f"missing {p}", file=sys.stderr)
            return 2
    import shutil
    import tempfile
    keep = bool(args.workdir)
    work = args.workdir or tempfile.mkdtemp(prefix="lragent-refreplay-")
    os.makedirs(work, exist_ok=True)
    try:
        return check(args, work, keep, t0)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def check(args, work, keep, t0):
    tok = Tokenizer(args.lragent, args.model)
    traj_file = os.path.join(args.shared, "data", "agent-trajectories", "13b_hotpotqa_200.json")
    script, info = build_script(tok, traj_file, args.entry)
    script_path = os.path.join(work, "script.json")
    json.dump(script, open(script_path, "w"))
    print(f"script: {os.path.basename(traj_file)} entry {info['entry']}, {info['agent_steps']} agent steps, "
          f"{info['tokens']} trajectory tokens (BOS included)" + (f"; outputs kept in {work}" if keep else ""), flush=True)

    model = ref.Model.load(args.model)
    tally = Tally()
    modes = [c for c in MODE_CASES if c[0] in args.modes]
    rows = []
    pool = ThreadPoolExecutor(max_workers=2)
    for aset in args.sets.split(","):
        adir = os.path.join(args.shared, "adapters", "tinystories-656k", aset)
        ads = {a: ref.Adapter.load(a, os.path.join(adir, a), model.n_layers) for a in AGENTS}
        try:  # base-lr is defined only for shared-A adapters: does the reference accept this set?
            ref.Replay(model, ads, "base-lr")
            shared_a = True
        except ref.ReplayError:
            shared_a = False
        # lragent runs in the background while the reference computes.
        futs = {label: pool.submit(run_lragent, args, aset, mode, rl, script_path) for label, mode, rl in modes
                if not (mode == "base-lr" and not shared_a)}
        ref_results = {}
        for label, mode, rl in modes:
            name = f"{aset}/{label}"
            if mode == "base-lr" and not shared_a:
                # Independent A: both must refuse.
                p, _ = run_lragent(args, aset, mode, rl, script_path)
                msg = (p.stderr + p.stdout).strip()
                tally.check(name + " refuses", p.returncode != 0 and re.search(r"shared[- ]?a|lora_a", msg, re.I),
                            f"rc {p.returncode}, message {msg[-300:]!r}")
                rows.append((aset, label, "refused" if p.returncode else "ran", "-", "-", "-", "-", "-", "-", "-"))
                print(f"{name}: lragent exit {p.returncode}: {msg.splitlines()[-1] if msg else ''}", flush=True)
                continue
            p, t_lr = futs[label].result()
            if p.returncode != 0:
                tally.check(name, False, f"lragent exited {p.returncode}: {p.stderr.strip()[-400:]}")
                rows.append((aset, label, "ERROR", "-", "-", "-", "-", "-", "-", "-"))
                continue
            if keep:
                with open(os.path.join(work, f"{aset}-{label}.json"), "w") as f:
                    f.write(p.stdout)
            lj = json.loads(p.stdout)
            # lragent's tokens only break greedy near-ties (reference logits within tol of each other).
            prefer = [s.get("output_tokens") or [] for s in lj.get("steps", [])]
            t = time.time()
            rr = ref.replay(model, ads, script, mode, [int(x) for x in rl.split(",") if x], prefer=prefer,
                            tie_tol=args.tol)
            t_ref = time.time() - t
            ref_results[label] = rr
            if rr["near_ties"]:
                print(f"{name}: {rr['near_ties']} greedy near-tie(s) within {args.tol} resolved as lragent did",
                      flush=True)
            problems, maxd = compare(lj, rr, args.tol)
            tally.check(name, not problems, "\n    " + "\n    ".join(problems[:12]))
            if "none" in ref_results:
                same, total, dev = vs_none(rr, ref_results["none"])
                agree = f"{same}/{total}"
                devs = f"{dev:.2e}"
            else:
                agree, devs = "-", "-"
            c = rr["cache"]
            rows.append((aset, label, "ok" if not problems else f"{len(problems)} diff", f"{maxd:.1e}",
                         f"{min_gap(rr, script):.1e}", agree, devs, str(c["total_bytes"]), f"{t_ref:.1f}", f"{t_lr:.2f}"))
        # Invariants of the reference itself (and of lragent where they are exact in the spec).
        if "none" in ref_results:
            rr = ref_results["none"]
            # none must equal an uncached whole-sequence HF forward with each agent's adapter.
            traj, worst = rr["trajectory"], 0.0
            full_logits = {a: ref.plain_forward(model, ads[a], traj[:-1]) for a in AGENTS}
            cursor = 1 + len(script["steps"][0]["append_tokens"])
            k = 0
            for st in script["steps"][1:]:
                if "append_tokens" in st:
                    cursor += len(st["append_tokens"])
                    continue
                s = rr["steps"][k]
                k += 1
                for r, row in enumerate(s["logits"]):
                    worst = max(worst, float(np.max(np.abs(full_logits[s["agent"]][cursor - 1 + r] - row))))
                cursor += len(s["output_tokens"])
            tally.check(f"{aset}/reference none == uncached HF forward", worst < 1e-9, f"max diff {worst:.3g}")
        if "none" in ref_results and "droidspeak[0,1]" in ref_results:
            a, b = ref_results["none"], ref_results["droidspeak[0,1]"]
            ok = all(x["output_tokens"] == y["output_tokens"] and x["prefilled_tokens"] == y["prefilled_tokens"]
                     for x, y in zip(a["steps"], b["steps"]))
            ok = ok and a["cache"] == b["cache"] and all(
                np.max(np.abs(u - v)) < 1e-12 for x, y in zip(a["steps"], b["steps"])
                for u, v in zip(x["logits"], y["logits"]))
            tally.check(f"{aset}/reference droidspeak[0,1] == none", ok, "differs")

    # droidspeak with a layer the model does not have.
    aset = ADAPTER_SETS[0]
    p, _ = run_lragent(args, aset, "droidspeak", "7", script_path)
    msg = (p.stderr + p.stdout).strip()
    tally.check("droidspeak --recompute-layers 7 refuses", p.returncode != 0 and re.search(r"\b7\b", msg),
                f"rc {p.returncode}, message {msg[-300:]!r}")
    rows.append((aset, "droidspeak[7]", "refused" if p.returncode else "ran", "-", "-", "-", "-", "-", "-", "-"))
    print(f"{aset}/droidspeak[7]: lragent exit {p.returncode}: {msg.splitlines()[-1] if msg else ''}", flush=True)
    pool.shutdown()

    hdr = ("adapter set", "mode", "lragent vs ref", "max|dlogit|", "min top2 gap", "steps = none", "dev vs none", "total B",
           "ref s", "lragent s")
    widths = [max(len(str(r[i])) for r in rows + [hdr]) for i in range(len(hdr))]
    print()
    print("  ".join(h.ljust(w) for h, w in zip(hdr, widths)))
    for r in rows:
        print("  ".join(str(x).ljust(w) for x, w in zip(r, widths)))
    print("\n(max|dlogit|: lragent vs reference over all logits rows; min top2 gap: closest greedy near-tie in the "
          "reference;\n steps = none: agent steps whose output tokens equal mode none's (reference); dev vs none: max "
          "logit deviation from none up to the first divergence)")
    if tally.failures:
        print("\nfailures:")
        for f in tally.failures:
            print("  " + f)
    print(f"\ntotal {time.time() - t0:.1f} s")
    print(f"{tally.passed} passed, {tally.failed} failed")
    return 0 if tally.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
