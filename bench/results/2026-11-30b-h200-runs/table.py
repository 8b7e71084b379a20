"""One line per fanin run of an A/B script's results file: tag, round, then the figures compared."""

import json
import sys

with open(sys.argv[1]) as results:
    for line in results:
        tag, _, js = line.partition("{")
        try:
            d = json.loads("{" + js)
        except ValueError:
            print(tag, "no result")
            continue
        c = d.get("check", {})
        print(
            tag.strip(), d["probes"], d["decode_workers_started"], d["decode_worker_moves"],
            d["delivered_events_per_s"], d.get("steady_delivered_events_per_s"), d["cpu_s_per_m_records"],
            d["collector_cpu_s"], d["workers_cpu_s"], d["peak_rss_anon_mib"],
            c.get("in_equals_disk_plus_drops"), d["drops"], d["shed_records"],
        )  # fmt: skip
