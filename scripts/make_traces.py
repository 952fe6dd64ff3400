#!/usr/bin/env python3
"""Builds bench/trace/trajectories.json, the real ReAct trajectories `lragent bench trace` scales
into benchmark traces (stdlib only; docs/bench.md says how a trace is made from them).

  scripts/make_traces.py ../shared/data/agent-trajectories > bench/trace/trajectories.json

Input: the LRAgent release's `*_{hotpotqa,scienceqa}_200.json` files, each a JSON list of
{"question", "answer", "correct", "reward", "halted", "error", "prompt"}, where "prompt" is the
whole episode: the system prompt, "Question: ...", then "Thought k: / Action k: / Observation k:"
lines. Kept per trajectory: the system prompt, the question and every round (thought, action,
observation) with the agent that wrote it: a round that follows the observation "Please reflect
your answer." (the Finish tool's reply) is the reflect agent's, every other round is the plan
agent's thought plus the action agent's action. A last observation "Answer is ..." is the
evaluator's verdict, not part of the agents' context, and is dropped.

Selection (deterministic): from each file, in entry order, the first trajectories that are
correct, neither halted nor errored, have 4 to 7 rounds, non-empty thoughts and actions, at least
two retrieval observations (BingSearch / Retrieve / Lookup), and end with the reflect agent's
Reflect[right]; plus, from each hotpotqa file, the first trajectory with the same checks that went
through a Reflect[wrong] loop (up to 10 rounds; these end with the second Finish, as recorded).
Entry 0 of the output, the default trace, is the plain trajectory with the most rounds.
"""
import argparse
import json
import os
import re
import sys

REFLECT_PROMPT = "Please reflect your answer."
RETRIEVAL = re.compile(r"^\s*(bing\s*search|retrieve|lookup|search)\s*\[", re.I)
LINE = re.compile(r"^(Thought|Action|Observation) (\d+):[ ]?(.*)$")


def parse_rounds(prompt, question):
    """The episode after the question: [{"thought", "action", "observation"}] or None."""
    start = prompt.rfind("Question: " + question)
    if start < 0:
        return None, None
    system = prompt[:start]
    rounds, field = [], None
    for line in prompt[start + len("Question: " + question):].split("\n"):
        m = LINE.match(line)
        if m:
            kind, k, text = m.group(1).lower(), int(m.group(2)), m.group(3)
            if kind == "thought":
                if k != len(rounds) + 1:
                    return None, None
                rounds.append({"thought": text, "action": "", "observation": ""})
            elif not rounds or k != len(rounds):
                return None, None
            else:
                rounds[-1][kind] = text
            field = kind
        elif rounds and field and line.strip():
            # A continuation line of a multi-line thought/action/observation.
            rounds[-1][field] += "\n" + line
    return system, rounds


def annotate(rounds):
    """Adds "agent" (plan | reflect) and "retrieval" to each round; drops the verdict line."""
    prev_obs = ""
    for r in rounds:
        r["agent"] = "reflect" if prev_obs.strip() == REFLECT_PROMPT else "plan"
        r["retrieval"] = r["agent"] == "plan" and bool(RETRIEVAL.match(r["action"])) and \
            not r["observation"].lower().startswith("invalid action")
        prev_obs = r["observation"]
    if rounds and rounds[-1]["observation"].startswith("Answer is "):
        rounds[-1]["observation"] = ""


def eligible(entry, rounds, loop):
    if not rounds or entry.get("error") or entry.get("halted") or not entry.get("correct"):
        return False
    if not all(r["thought"].strip() and r["action"].strip() for r in rounds):
        return False
    last = rounds[-1]
    ends_reflect = last["agent"] == "reflect" and "reflect[right]" in last["action"].lower()
    ends_finish = last["agent"] == "plan" and last["action"].lower().startswith("finish[")
    n_retrieval = sum(r["retrieval"] for r in rounds)
    wrong_loop = any(r["agent"] == "reflect" and "reflect[wrong]" in r["action"].lower() for r in rounds)
    if loop:
        return wrong_loop and (ends_reflect or ends_finish) and n_retrieval >= 2 and len(rounds) <= 10
    return ends_reflect and not wrong_loop and n_retrieval >= 2 and 4 <= len(rounds) <= 7


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="agent-trajectories directory")
    ap.add_argument("--per-file", type=int, default=2, help="plain trajectories kept per file")
    args = ap.parse_args()
    files = ["13b_hotpotqa_200.json", "70b_hotpotqa_200.json", "13b_scienceqa_200.json", "70b_scienceqa_200.json"]
    out = []
    for name in files:
        path = os.path.join(args.dir, name)
        entries = json.load(open(path, encoding="utf-8"))
        wanted = [(False, args.per_file)] + ([(True, 1)] if "hotpotqa" in name else [])
        for loop, count in wanted:
            for i, e in enumerate(entries):
                if count == 0:
                    break
                system, rounds = parse_rounds(e["prompt"], e["question"])
                if rounds is None:
                    continue
                annotate(rounds)
                if not eligible(e, rounds, loop):
                    continue
                out.append({"id": "%s#%d" % (name, i), "question": e["question"], "answer": e["answer"],
                            "system_prompt": system,
                            "rounds": [{k: r[k] for k in ("agent", "thought", "action", "observation", "retrieval")}
                                       for r in rounds]})
                count -= 1
            if count:
                sys.exit("%s: only found %d of the wanted trajectories (loop=%s)" % (path, len(out), loop))
    # The default trace (entry 0) is the plain trajectory with the most rounds, i.e. agent calls
    # (the first one on ties): the most multi-agent of the typical 4-7 round episodes.
    plain = [t for t in out if not any("reflect[wrong]" in r["action"].lower() for r in t["rounds"])]
    default = max(plain, key=lambda t: len(t["rounds"]))
    out.remove(default)
    out.insert(0, default)
    doc = {"source": "LRAgent agent-trajectories (Apache-2.0), selected by scripts/make_traces.py",
           "reflect_prompt": REFLECT_PROMPT, "trajectories": out}
    json.dump(doc, sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
