"""Refuse to run with part of the SDK shadowed by a user's file.

Tensorwire's packages have plain top-level names: ``protocol``, ``client``, ``server``. A
``protocol.py`` (or ``client.py``, ``server.py``) next to a user's script comes first on
``sys.path``, and the SDK would import it in place of its own package, failing later with an
error that names neither file. Each package calls :func:`refuse_shadowing` first thing, before
it imports a sibling, so that the user's file never runs.

Standard library only: ``client`` and ``server`` run this file by its path
(:func:`runpy.run_path`), since ``import protocol`` could be the shadowing file itself.
"""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

SDK_PACKAGES = ("protocol", "client", "server")


def shadowing_files(root: Path) -> dict[str, str]:
    """The SDK package names that resolve to something other than ``root / name``, each with
    the file or directory it resolves to. Nothing is imported: an imported module's own spec
    is used, else the import system's search."""
    found = {}
    for name in SDK_PACKAGES:
        try:
            spec = find_spec(name)
        except (ImportError, ValueError):  # a half-made module in sys.modules: not ours
            found[name] = "a module without a spec"
            continue
        if spec is None:
            continue  # absent (a slimmer install): nothing shadows it
        where = spec.origin
        if where is None and spec.submodule_search_locations:  # a folder without __init__.py
            where = next(iter(spec.submodule_search_locations))
        if where is None or Path(where).resolve() != (root / name / "__init__.py").resolve():
            found[name] = str(where)
    return found


def refuse_shadowing(package_file: str) -> None:
    """Raise if a sibling of the package whose ``__init__.py`` is ``package_file`` resolves to
    a file outside this installation of Tensorwire.

    Raises:
        ImportError: naming each shadowing file and how to avoid it.
    """
    root = Path(package_file).resolve().parent.parent
    shadowed = shadowing_files(root)
    if shadowed:
        files = ", ".join(f"'{name}' is {where}" for name, where in shadowed.items())
        raise ImportError(
            f"Tensorwire's packages are shadowed: {files}, not Tensorwire's (in {root}). "
            "A file or folder named protocol, client or server next to your script (or earlier "
            "on sys.path) hides the SDK's package of that name: rename it (and delete its "
            "__pycache__)"
        )
