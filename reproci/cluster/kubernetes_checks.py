"""What ``reproci matrix --format k8s`` accepts: names Kubernetes takes, quantities, image
references by digest, models a pod can import; each refusal one line naming the flag and what
to pass. Standard library only; ``kubernetes.py`` builds the options and the objects from these."""

from __future__ import annotations

import re
from datetime import datetime, timezone

from ..errors import UsageError

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
QUANTITY = re.compile(r"^([0-9]+(\.[0-9]+)?|\.[0-9]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
REPOSITORY = r"(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
DIGEST_REF = re.compile(rf"^{REPOSITORY}@sha256:[0-9a-f]{{64}}$")


def default_name(now: datetime | None = None) -> str:
    """``reproci-YYYYMMDD-HHMMSS`` (UTC): a new name per run, since a Job's spec cannot change."""
    return "reproci-" + (now or datetime.now(timezone.utc)).strftime("%Y%m%d-%H%M%S")


def check(value: str, pattern: re.Pattern[str], flag: str, what: str, limit: int = 63) -> str:
    if not pattern.match(value) or len(value) > limit:
        raise UsageError(f"{flag} {value!r} is not {what} (at most {limit} characters)")
    return value


def parse_digests(texts: tuple[str, ...]) -> dict[str, str]:
    """``--digest NAME=REPO@sha256:HEX``, each image once."""
    out: dict[str, str] = {}
    for text in texts:
        name, sep, ref = text.partition("=")
        if not sep or not name or not DIGEST_REF.match(ref):
            raise UsageError(f"--digest {text!r} is not NAME=REPO@sha256:HEX (64 lowercase hex digits), such as "
                             f"cpu-torch2.13=registry.example.com/reproci/cpu-torch2.13@sha256:{'0' * 64}")
        if name in out:
            raise UsageError(f"--digest names the image {name} twice; give one digest per image")
        out[name] = ref
    return out


def model_cells(texts: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """(--model text, short name) per model: a reference model, or module:factory installed in
    the image. A FILE.py on this machine never reaches the pods: refused."""
    from ..reference_models import REGISTRY
    from ..settings.models import module_model_name

    out: list[tuple[str, str]] = []
    for text in texts:
        target, sep, factory = text.rpartition(":")
        if text in REGISTRY:
            out.append((text, text))
        elif sep and target and not target.endswith(".py") and factory.isidentifier() \
                and all(p.isidentifier() for p in target.split(".")):
            out.append((text, module_model_name(target, factory)))
        else:
            raise UsageError(f"--model {text!r} cannot run in a pod: use one of {', '.join(REGISTRY)}, or "
                             "module:factory of a package installed in the image (a FILE.py stays on this machine)")
    names = [n for _, n in out]
    if len(set(names)) != len(names) or not out:
        raise UsageError(f"--model: each model once, at least one (got {', '.join(names) or 'none'})")
    return tuple(out)


def default_models() -> tuple[str, ...]:
    """The reference models, as ``reproci run`` runs them when neither --model nor reproci.yaml names any."""
    from ..reference_models import REGISTRY

    return tuple(REGISTRY)
