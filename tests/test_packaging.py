"""What `pip install .` puts on a user's machine: every package of the source tree."""

import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _listed():
    options = configparser.ConfigParser()
    options.read(ROOT / "setup.cfg")
    packages = set(options["options"]["packages"].split())
    mapped = dict(
        (name.strip(), folder.strip())
        for name, folder in (
            line.split("=") for line in options["options"]["package_dir"].strip().splitlines()
        )
    )
    return packages, mapped


def _on_disk(mapped):
    found = set()
    for init in (ROOT / "rafi").rglob("__init__.py"):
        found.add(".".join(init.parent.relative_to(ROOT).parts))
    for name, folder in mapped.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            found.add(".".join([name, *init.parent.relative_to(ROOT / folder).parts]))
    return found


def test_every_package_is_installed():
    packages, mapped = _listed()
    missing = _on_disk(mapped) - packages
    assert not missing, f"setup.cfg [options] packages lacks {sorted(missing)}"


def test_every_listed_package_exists():
    packages, mapped = _listed()
    assert packages <= _on_disk(mapped)
