"""A policy text read whole: every SchedulingPolicy and CgroupPolicy in it, or every located
error of it (FILE:LINE:COL). Pure: nothing here touches the store or the kernel."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...spec import SpecError, load_text

SUFFIXES = (".yaml", ".yml")
# A Kubernetes ConfigMap volume changes all its files at once by renaming this symlink
# (kubelet's atomic writer): the files' own names see no event, so it means "rescan".
CONFIGMAP_SWAP = "..data"
KINDS = ("SchedulingPolicy", "CgroupPolicy")


class PolicyError(ValueError):
    """`invalid`: the text is bad (FILE:LINE:COL); else a refusal."""

    def __init__(self, message: str, invalid: bool = True):
        super().__init__(message)
        self.invalid = invalid


@dataclass(frozen=True)
class Loaded:
    kind: str
    name: str
    value: object  # SchedulingPolicy or CgroupPolicy
    file_name: str
    version: int = 0  # API-applied: the store's version; files: 0
    applied_ns: int = 0
    # Its own document's text (a CgroupPolicy: its whole file, which holds it alone): what
    # the store keeps of an applied policy, so that a file of N policies is stored once, not
    # N times.
    text: str = field(default="", repr=False, compare=False)

    def info(self) -> dict:
        return {
            "kind": self.kind,
            "name": self.name,
            "version": self.version,
            "applied_ns": self.applied_ns,
            "file_name": self.file_name,
        }


def parse_source(text: str, file_name: str) -> list[Loaded]:
    """Every policy of a text; PolicyError with every located error of it."""
    from ...cgroups.policy import load_policy_text
    from ...policy.policy import parse_policy

    try:
        docs = [d for d in load_text(text, file_name) if d.value is not None]
        if not docs:
            raise SpecError(file_name, 1, 1, "empty: expected a SchedulingPolicy or CgroupPolicy")
        kinds = []
        for doc in docs:
            kind = doc.root.mapping(required={"kind"})["kind"].str(list(KINDS))
            kinds.append(kind)
        if "CgroupPolicy" in kinds:
            if len(docs) > 1:
                raise docs[0].root.error("a CgroupPolicy file holds that one document only")
            policy = load_policy_text(text, file_name)
            if not policy.name:
                raise docs[0].root.error("metadata.name: a CgroupPolicy the agent keeps is named")
            return [Loaded("CgroupPolicy", policy.name, policy, file_name, text=text)]
        out = []
        for doc in docs:
            policy = parse_policy(doc)
            out.append(Loaded("SchedulingPolicy", policy.name, policy, file_name, text=doc.text))
        return out
    except SpecError as exc:
        raise PolicyError(str(exc)) from None
    except ValueError as exc:  # a loader's unlocated error (a device that does not exist)
        raise PolicyError(f"{file_name}: {exc}") from None
