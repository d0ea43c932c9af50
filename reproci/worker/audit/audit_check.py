"""The audit's table against a torch's own list, both ways: ``reproci audit --check-table``, or
in an image that has only python3 and torch: ``python3 -m reproci.worker.audit.audit_check``
(stdlib and torch only). Exit 0 when every item is covered and no entry is stale, else 1."""

from __future__ import annotations

import sys
from typing import Callable


def report(say: Callable[[str], None] = print) -> int:
    import torch

    from .audit import EXCLUDED, completeness, documented

    docs = documented()
    result = completeness(docs)
    raises = sum(v == "raises" for v in docs.values())
    say(f"torch {torch.__version__}: {len(docs)} items in torch.use_deterministic_algorithms' docs ({raises} raise, "
        f"{len(docs) - raises} use a deterministic implementation); {len(EXCLUDED)} excluded on purpose")
    for item in result["missing"]:
        say(f"missing: {item} (torch: {docs[item]}): no audit entry; add one to reproci/worker/audit/audit_table.py "
            "or an exclusion with its reason")
    for item in result["stale"]:
        say(f"stale: {item}: an entry stands for it, but torch {torch.__version__}'s list no longer has it")
    if not result["missing"] and not result["stale"]:
        say("the audit's table covers every item, and every entry's item is in the list")
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(report())
