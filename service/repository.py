"""The model repository: every model directory under ``settings.models_dir``, scanned and (re)loaded.

Layout::

    models/<dir>/manifest.json            served as manifest.name
    models/<dir>/<version>/manifest.json  served as "<manifest.name>@<version>"; "<manifest.name>"
                                          is an alias of the highest version
    models/.<anything>/                   ignored at both levels (the exporter's staging directories)

``ModelRepository.load`` returns a ``Catalog`` (models by name, aliases, per-directory errors) without
installing it: the server (``service.server``) swaps it in together with the models' batchers.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from retention_core.contract import MANIFEST_FILE
from service.runtime import LoadedModel, ModelLoadError, fingerprint, load_model
from service.serving import ReloadReport
from service.settings import Settings

log = logging.getLogger("service")

# (directory, fingerprint) of every model directory: equal signatures mean nothing to reload.
Signature = tuple[tuple[str, str], ...]


def visible_dirs(parent: Path) -> list[Path]:
    """Sub-directories, sorted, without hidden ones: the exporter stages a model in ``.<name>.staging*``
    next to the live directory and swaps it in when complete, so a dot-directory is never served."""
    return sorted(p for p in parent.iterdir() if p.is_dir() and not p.name.startswith("."))


def version_key(name: str) -> tuple[object, ...]:
    """Natural order: v2 < v10."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def source_model_aliases(models: dict[str, LoadedModel], aliases: dict[str, str]) -> dict[str, str]:
    """Each manifest's own aliases (an embedding retrofit's source model: its hub id and short name) →
    the name that serves it: the latest version of its base name, or itself. A served name or version
    alias always wins; an alias two models claim names neither (it would route by load order)."""
    claims: dict[str, set[str]] = {}
    for name, model in models.items():
        base = model.manifest.name
        target = aliases.get(base, name)
        for alias in model.manifest.aliases:
            claims.setdefault(alias, set()).add(target)
    taken = set(models) | set(aliases)
    return {
        alias: next(iter(targets))
        for alias, targets in claims.items()
        if len(targets) == 1 and alias not in taken
    }


@dataclass(frozen=True)
class Catalog:
    """The models one scan of the repository loaded, by served name; aliases name -> name@version."""

    models: dict[str, LoadedModel] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # directory (relative to the root) -> message

    def find(self, name: str) -> LoadedModel | None:
        """The model served as ``name`` or under the alias ``name``."""
        return self.models.get(self.aliases.get(name, name))

    def report_since(self, old: Catalog) -> ReloadReport:
        """What replacing ``old`` by this catalog loads, keeps and removes."""
        report = ReloadReport(errors=self.errors)
        for name, model in self.models.items():
            (report.unchanged if old.models.get(name) is model else report.loaded).append(name)
        report.removed = sorted(name for name in old.models if name not in self.models)
        return report

    def dropped_since(self, old: Catalog) -> list[LoadedModel]:
        """The models ``old`` served that this catalog does not (removed, or replaced by a fresh load):
        their backends close once their in-flight runs end (``service.server``)."""
        kept = {id(model) for model in self.models.values()}
        return [model for model in old.models.values() if id(model) not in kept]


class ModelRepository:
    """The model directories under ``settings.models_dir``: what is there (``scan``, ``signature``) and
    what it loads to (``load``)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def scan(self) -> tuple[list[tuple[Path, str | None, str | None]], list[Path]]:
        """(directory, version, alias group) of every model directory under the root, and the
        directories this process may not read (e.g. another user's mode 0700): those are reported by
        name, and must not hide the readable ones."""
        root = self.settings.models_dir
        found: list[tuple[Path, str | None, str | None]] = []
        unreadable: list[Path] = []
        if not root.is_dir():
            return found, unreadable
        for child in visible_dirs(root):
            try:
                if (child / MANIFEST_FILE).is_file():
                    found.append((child, None, None))
                    continue
                versions = sorted(
                    (p for p in visible_dirs(child) if (p / MANIFEST_FILE).is_file()),
                    key=lambda p: version_key(p.name),
                )
            except PermissionError:
                unreadable.append(child)
                continue
            found.extend((version, version.name, child.name) for version in versions)
        return found, unreadable

    def relative(self, directory: Path) -> str:
        try:
            return str(directory.relative_to(self.settings.models_dir))
        except ValueError:
            return directory.name

    def signature(self) -> Signature:
        """(directory, fingerprint) of every model directory: equal signatures mean nothing to reload."""
        try:
            found, unreadable = self.scan()
            readable = tuple((str(directory), fingerprint(directory)) for directory, _, _ in found)
            return readable + tuple((str(directory), "unreadable") for directory in unreadable)
        except OSError:  # a directory swapped away mid-scan (the exporter's rename): unlike any real look
            return (("", "unreadable"),)

    async def load(self, current: Catalog) -> Catalog:
        """Rescan the root. Directories unchanged since ``current`` keep their loaded model; changed ones
        are loaded (and warmed up) afresh; a broken directory is reported, and whatever ``current``
        served from it is kept."""
        loop = asyncio.get_running_loop()
        by_dir = {m.directory.resolve(): m for m in current.models.values()}
        new_models: dict[str, LoadedModel] = {}
        new_aliases: dict[str, str] = {}
        latest: dict[str, tuple[tuple[object, ...], str]] = {}
        errors: dict[str, str] = {}
        found, unreadable = self.scan()
        for directory in unreadable:
            rel = self.relative(directory)
            errors[rel] = f"{directory.name}: not readable by the service (check its permissions)"
            log.error("model directory %s not loaded: permission denied", rel)
        for directory, version, _group in found:
            rel = self.relative(directory)
            old = by_dir.get(directory.resolve())
            model: LoadedModel | None = None
            try:
                if old is not None and old.fingerprint == fingerprint(directory):
                    model = old
                else:
                    model = await loop.run_in_executor(None, load_model, directory, self.settings)
                    base = model.manifest.name
                    model.name = f"{base}@{version}" if version else base
            except ModelLoadError as exc:
                errors[rel] = str(exc)
                log.error("model directory %s not loaded: %s", rel, exc)
                model = old  # keep serving the previous version of this directory
            except Exception as exc:  # never let one directory break the reload
                errors[rel] = f"{directory.name}: unexpected error while loading"
                log.exception("model directory %s not loaded", rel, exc_info=exc)
                model = old
            if model is None:
                continue
            if model.name in new_models:
                errors[rel] = f"{directory.name}: duplicate model name {model.name!r}"
                log.error("model directory %s not loaded: duplicate name %s", rel, model.name)
                if model is not old:  # loaded just now, never served: nothing can be running on it
                    model.backend.close()
                continue
            new_models[model.name] = model
            if version:
                base = model.manifest.name
                key = version_key(version)
                if base not in latest or key > latest[base][0]:
                    latest[base] = (key, model.name)
        for base, (_key, name) in latest.items():
            if base not in new_models:
                new_aliases[base] = name
        new_aliases.update(source_model_aliases(new_models, new_aliases))
        return Catalog(new_models, new_aliases, errors)
