"""The package list of the one distribution (the metadata is in pyproject.toml).

The design card's top-level folders are mapped into one import namespace,
``duplexcadence.*``, so nothing called ``compiler`` or ``runtime`` lands in
site-packages; ``duplexcadence`` itself is an implicit namespace package. The list is
computed, not typed: every package under these folders -- a newly generated adapter
in ``generated/<contract>/`` included -- goes into the wheel without being named here.
"""

from setuptools import find_packages, setup

FOLDERS = ("dsl", "compiler", "templates", "runtime", "generated", "contracts")

setup(
    package_dir={f"duplexcadence.{folder}": folder for folder in FOLDERS},
    packages=[
        f"duplexcadence.{package}"
        for package in find_packages(include=[*FOLDERS, *(f"{f}.*" for f in FOLDERS)])
    ],
)
