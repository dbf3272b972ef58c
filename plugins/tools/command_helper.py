"""Written by rackbench (plugins/benchmarks/command.py): runs one allowed command and reads the campaign's patterns.

  python3 rackbench_command.py command.json

It runs the plan's ``argv`` (a list: nothing goes through a shell), passes its output through, and after the program
has ended prints one line ``#rackbench-command {...}`` with the program's exit status and, for each declared pattern,
the number its first matching line gave (or the pattern's name under "unmatched"). The patterns are matched here, on
the node, line by line (lines cut at 4096 characters), so a costly regex costs the node that asked for it, never the
worker. It exits with the program's exit status.

It runs on the hosts with their own python3 (3.6 and later): standard library only.
"""

import json
import re
import subprocess
import sys

HEADER = "#rackbench-command "
MAX_LINE = 4096
NUMBER = re.compile(r"[+-]?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


def first_number(regex, lines):
    for line in lines:
        match = regex.search(line)
        if not match:
            continue
        raw = match.group("value") if "value" in regex.groupindex else match.group(1)
        if raw is not None and NUMBER.fullmatch(raw.strip()):
            return float(raw.strip().replace(",", ""))
    return None


def main(argv):
    if len(argv) != 2:
        sys.stderr.write(__doc__)
        return 2
    with open(argv[1]) as f:
        plan = json.load(f)
    try:
        proc = subprocess.run(plan["argv"], stdout=subprocess.PIPE)
    except OSError as exc:
        sys.stderr.write("cannot start {}: {}\n".format(plan["argv"][0], exc))
        return 127
    text = proc.stdout.decode("utf-8", "replace")
    sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
    lines = [line[:MAX_LINE] for line in text.splitlines()]
    values, unmatched = {}, []
    for name, spec in plan["patterns"].items():
        found = first_number(re.compile(spec["regex"]), lines)
        if found is None:
            unmatched.append(name)
        else:
            values[name] = found
    units = {name: spec["unit"] for name, spec in plan["patterns"].items()}
    result = {"exit_code": proc.returncode, "values": values, "unmatched": unmatched, "units": units}
    sys.stdout.write(HEADER + json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()
    return proc.returncode if 0 <= proc.returncode < 256 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
