"""Sphinx configuration: the API reference from rafi's docstrings, the guide from README.md."""

import os
import sys

from sphinx.ext.napoleon import GoogleDocstring

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's rafi
import rafi  # noqa: E402

project = "rafi"
author = "rafi developers"
release = version = rafi.__version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "myst_parser"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]

html_theme = "furo"
html_title = f"rafi {release}"

autodoc_member_order = "bysource"
add_module_names = False
napoleon_numpy_docstring = False


def _public_bases(app, name, obj, options, bases):
    """Show a private base (``_errors._Detailed``) as its nearest public ancestor (``RafiError``)."""
    public = [next(c for c in b.__mro__ if not c.__name__.startswith("_")) for b in bases]
    bases[:] = dict.fromkeys(public)


_property_docs = {}


def _keep_property_doc(app, what, name, obj, options, lines):
    """Remember a property's docstring before napoleon reads its first line as ``type: text``."""
    if what == "property":
        _property_docs[name] = list(lines)


def _property_doc_as_text(app, what, name, obj, options, lines):
    """Parse a property's docstring like a method's: rafi's summaries are sentences, not types."""
    if what == "property":
        lines[:] = GoogleDocstring(_property_docs.pop(name), app.config, app, "method", name, obj).lines()


def setup(app):
    app.connect("autodoc-process-bases", _public_bases)
    app.connect("autodoc-process-docstring", _keep_property_doc, priority=400)  # napoleon: 500
    app.connect("autodoc-process-docstring", _property_doc_as_text, priority=600)
