#!/usr/bin/env python3
"""Builds a `lragent replay` script from a real ReAct trajectory (stdlib only).

The step structure and the tool observations come from the trajectory; the agents' own turns
are generated: plan writes each Thought, action each Action, reflect the final Reflect line.
Observations are shortened so the whole trajectory fits a small model's context.

  scripts/make_replay_script.py ../shared/data/agent-trajectories/13b_hotpotqa_200.json \
      --entry 3 --rounds 6 > examples/replay-hotpotqa.json
"""
import argparse
import json
import re
import sys


def rounds_of(prompt, question):
    """(k, observation) pairs of the trajectory that follows the question."""
    tail = prompt[prompt.rfind("Question: " + question):]
    return [(int(m.group(1)), m.group(2).strip())
            for m in re.finditer(r"^Observation (\d+): (.*)$", tail, flags=re.M)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trajectories")
    ap.add_argument("--entry", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--observation-chars", type=int, default=110)
    ap.add_argument("--thought-tokens", type=int, default=12)
    ap.add_argument("--action-tokens", type=int, default=10)
    args = ap.parse_args()
    entry = json.load(open(args.trajectories))[args.entry]
    obs = rounds_of(entry["prompt"], entry["question"])
    if not obs:
        sys.exit("no Observation lines after the question in entry %d" % args.entry)
    steps = [{"append": "Question: %s\n" % entry["question"]}]
    for k in range(1, args.rounds + 1):
        observation = obs[min(k, len(obs)) - 1][1][: args.observation_chars]
        steps += [
            {"append": "Thought %d:" % k},
            {"agent": "plan", "generate": args.thought_tokens, "stop": ["\n"]},
            {"append": "Action %d:" % k},
            {"agent": "action", "generate": args.action_tokens, "stop": ["\n"]},
            {"append": "Observation %d: %s\n" % (k, observation)},
        ]
    steps += [{"append": "Observation: Please reflect your answer.\nReflect:"},
              {"agent": "reflect", "generate": 10, "stop": ["\n"]}]
    json.dump({"source": "%s entry %d" % (args.trajectories.split("/")[-1], args.entry), "steps": steps},
              sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
