"""One input of an analysis, resolved once: what PATH is (a trace file, a folder of traces, a run folder) and, for a
run folder, its manifest and config.yaml, each read once however many steps of the analysis ask for them (the
command line, the loader, the process groups' record, the run's own figures)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepscope.runfolder.manifest import Manifest


class Source:
    """PATH of an analysis, with what is read of it kept: pass the same Source to every step of one analysis.

    `str(source)` and `os.fspath(source)` are its path as given (a trailing slash kept), so a step that only needs
    the path takes it as one."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._given = str(path)
        self._run: bool | None = None
        self._manifest: tuple[Manifest, list[str]] | None = None
        self._config: tuple[dict[str, Any], list[str]] | None = None

    def __fspath__(self) -> str:
        return self._given

    def __str__(self) -> str:
        return self._given

    def __repr__(self) -> str:
        return f"Source({str(self.path)!r})"

    @property
    def is_run_folder(self) -> bool:
        """A folder with a manifest or the layout of one (runfolder.is_run_folder); a file is not."""
        if self._run is None:
            if self.path.is_dir():
                from stepscope.runfolder import is_run_folder

                self._run = is_run_folder(self.path)
            else:  # (a trace file: none of the run folders' modules)
                self._run = False
        return self._run

    def manifest(self) -> tuple[Manifest, list[str]]:
        """The run folder's manifest and the notes its reading gave (a damaged one rebuilt from the files), read
        on the first call; the notes are a new list each time (callers add to them)."""
        if self._manifest is None:
            from stepscope.runfolder.manifest import load_manifest

            self._manifest = load_manifest(self.path)
        manifest, notes = self._manifest
        return manifest, list(notes)

    def config(self, notes: list[str]) -> dict[str, Any]:
        """The run folder's config.yaml as a dict ({} when missing or damaged), read on the first call; the notes
        its reading gave are added to `notes` at every call."""
        if self._config is None:
            from stepscope.analysis.read.records import read_config
            from stepscope.runfolder import CONFIG_NAME

            said: list[str] = []
            self._config = (read_config(self.path / CONFIG_NAME, said), said)
        config, said = self._config
        notes.extend(said)
        return dict(config)

    def comm_patterns(self, given: tuple[str, ...] = ()) -> tuple[str, ...]:
        """The communication patterns of an analysis of this input: a run folder's (its config.yaml's
        comm_patterns, those that compile), then `given` (the command line's)."""
        if not self.is_run_folder:
            return tuple(given)
        import regex  # (the engine the analysis searches them with: per_rank/kernels.CommPattern)

        patterns = self.config([]).get("comm_patterns")
        configured = []
        for pattern in patterns if isinstance(patterns, list) else []:
            if isinstance(pattern, str):
                try:
                    regex.compile(pattern)
                except regex.error:
                    continue
                configured.append(pattern)
        return (*configured, *given)


def as_source(path: str | Path | Source) -> Source:
    """`path` as a Source: itself when it is one (what was read of it is kept), else a new one."""
    return path if isinstance(path, Source) else Source(path)
