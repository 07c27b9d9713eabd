# SPDX-License-Identifier: BSD-3-Clause
# Helpers of the iostats latency tests.  Source after functions.sh.

# percentiles FILE: "op count p50 p90 p99 max mean" lines from a JSON
# report.
percentiles ()
{
  /usr/bin/python3 -c '
import json, sys
r = json.loads(open(sys.argv[1]).read())
for op, o in r["ops"].items():
    print(op, o["count"], o["p50_s"], o["p90_s"], o["p99_s"], o["max_s"],
          o["mean_s"])
' "$1"
}

# within VALUE LOW HIGH
within ()
{
  /usr/bin/python3 -c 'import sys; v, lo, hi = map(float, sys.argv[1:]); sys.exit(not lo <= v <= hi)' "$@"
}
