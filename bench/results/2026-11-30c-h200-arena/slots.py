"""The reply slots of every run under a results folder: replies that named a slot, takes that
found none idle (their replies came over the socket), slots made, and the decodes."""

import json
import sys
from pathlib import Path

for report in sorted(Path(sys.argv[1]).glob("*/n*/report.json")):
    r = json.loads(report.read_text())
    print(
        report.parent.parent.name, r["probes"], "replies", r.get("reply_slot_replies"), "full",
        r.get("reply_slot_full"), "slots", r.get("reply_slots"), "decodes", r["activity_decodes"],
        "records", r["activity_records"], "collector_cpu_s", r["collector_cpu_s"],
    )  # fmt: skip
