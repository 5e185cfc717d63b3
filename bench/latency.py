#!/usr/bin/env python3
"""Prints p50, p99 and max transaction latency (microseconds) from pgbench
--log files given as arguments (third field of each line)."""
import sys

lat = []
for path in sys.argv[1:]:
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3:
                lat.append(int(parts[2]))
lat.sort()
if not lat:
    sys.exit("no latencies")
pick = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]
print(pick(0.50), pick(0.99), lat[-1], len(lat))
