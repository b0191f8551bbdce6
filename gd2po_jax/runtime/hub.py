"""Hugging Face Hub ids for models and data sets: ``org/name`` with an optional ``@revision``.

A config field that takes a model directory (``model.path``, ``model.tokenizer_path``,
``rewards.reward_models.<name>.path``) or a data set also takes a Hub id. It is resolved to a local
snapshot with `huggingface_hub.snapshot_download`, so the Hub's own settings apply as users expect:
``HF_HOME`` / ``HF_HUB_CACHE`` (where snapshots live), ``HF_HUB_OFFLINE=1`` (the cache only),
``HF_TOKEN`` or ``hf auth login`` (gated and private repositories). Models are fetched as
safetensors only (with their configs, tokenizer files and chat templates), never pickled weights.

A path that exists locally always wins over a Hub id of the same spelling; one that does not exist
but whose parent directory does (``models/qwn``) and that the Hub does not have is reported as a
mistyped local path (with the closest names there), not as a Hub cache miss.
"""

from __future__ import annotations

import dataclasses
import difflib
import pathlib
import re

import huggingface_hub
from huggingface_hub import errors as hub_errors

MODEL_FILES = ("*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "tokenizer*")
"""What a model snapshot fetches: configs, safetensors weights (and their index), tokenizer files,
chat templates; no ``*.bin`` / ``*.pt`` / ``*.h5`` / ``*.msgpack`` weights."""

_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[\w./-]+))?$")


@dataclasses.dataclass(frozen=True)
class HubId:
    """``repo_id`` (``org/name``) and an optional ``revision`` (a branch, tag or commit)."""

    repo_id: str
    revision: str | None = None

    @classmethod
    def parse(cls, text: str) -> HubId | None:
        """The Hub id ``text`` spells (``org/name`` or ``org/name@revision``), or None."""
        match = _HUB_ID.match(str(text))
        return cls(match["repo"], match["revision"]) if match else None

    def __str__(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")

    def fetch_command(self, repo_type: str = "model") -> str:
        """The command that puts this id in the cache (huggingface_hub's ``hf`` CLI)."""
        return " ".join(
            [
                "hf download",
                self.repo_id,
                *([f"--revision {self.revision}"] if self.revision else []),
                *(["--repo-type dataset"] if repo_type == "dataset" else []),
            ]
        )


def snapshot(hub_id: HubId, *, repo_type: str, what: str, allow_patterns=None) -> pathlib.Path:
    """The local snapshot directory of ``hub_id`` (downloaded unless ``HF_HUB_OFFLINE``).

    Args:
      repo_type: "model" or "dataset".
      what: how errors name the source (e.g. ``"config.model.path"``).
      allow_patterns: the files to fetch (None: all).

    Raises:
      FileNotFoundError: naming ``what``, the id and the command that fetches it, when the id is not
        in the cache while offline, does not exist, is gated, or the Hub cannot be reached.
    """
    try:
        return pathlib.Path(
            huggingface_hub.snapshot_download(
                hub_id.repo_id, repo_type=repo_type, revision=hub_id.revision, allow_patterns=allow_patterns
            )
        )
    except hub_errors.LocalEntryNotFoundError:
        problem = (
            f"is not in the Hugging Face cache ({huggingface_hub.constants.HF_HUB_CACHE}) and downloads "
            "are off (HF_HUB_OFFLINE=1) or the Hub cannot be reached"
        )
    except hub_errors.GatedRepoError:
        problem = "is a gated repository: accept its terms on the Hub and log in (hf auth login, or set HF_TOKEN)"
    except hub_errors.RepositoryNotFoundError:
        problem = "is not a repository on the Hub (or a private one: log in with hf auth login, or set HF_TOKEN)"
    except hub_errors.RevisionNotFoundError:
        problem = f"has no revision {hub_id.revision!r}"
    except (hub_errors.HfHubHTTPError, OSError) as err:
        problem = f"could not be fetched ({type(err).__name__}: {err})"
    raise FileNotFoundError(f"{what}: {str(hub_id)!r} {problem}; fetch it with: {hub_id.fetch_command(repo_type)}")


def resolve_model_dir(path: str | pathlib.Path, what: str = "model directory") -> pathlib.Path:
    """A local Hugging Face model directory for ``path``: ``path`` itself when it is a directory,
    else the snapshot of the Hub id it spells (`snapshot`, safetensors only).

    Raises:
      FileNotFoundError: naming ``what``: ``path`` is a file, or neither a directory nor a Hub id
        (saying what is accepted), or a Hub id that cannot be had (`snapshot`).
    """
    local = pathlib.Path(path)
    if local.is_dir():
        return local
    hub_id = None if local.exists() else HubId.parse(str(path))
    if hub_id is None:
        problem = "is a file, not a directory" if local.exists() else f"does not exist{nearby(local)}"
        raise FileNotFoundError(
            f"{what}: {str(path)!r} {problem}; give a local Hugging Face model directory (config.json, "
            "*.safetensors, tokenizer files) or a Hub id such as 'org/name' or 'org/name@revision'"
        )
    try:
        return snapshot(hub_id, repo_type="model", what=what, allow_patterns=list(MODEL_FILES))
    except FileNotFoundError as err:
        if local.parent.is_dir() and local.parent != pathlib.Path("."):  # 'models/qwn': a local path, mistyped
            raise FileNotFoundError(
                f"{what}: {str(path)!r} does not exist{nearby(local)} (nor is it a model on the Hub: "
                f"{str(err).partition(': ')[2].split(';')[0]}); give an existing directory"
            ) from None
        raise


def nearby(path: pathlib.Path) -> str:
    """``"; models/ has 'qwen2', 'qwen3'"``: the names in ``path``'s (existing) parent directory
    closest to its name, for a path that does not exist (empty when there are none)."""
    parent = path.parent
    try:
        names = [p.name for p in parent.iterdir()] if parent.is_dir() else []
    except OSError:
        return ""
    close = difflib.get_close_matches(path.name, names, n=3, cutoff=0.5)
    return f"; {parent}/ has {', '.join(repr(n) for n in close)}" if close else ""
