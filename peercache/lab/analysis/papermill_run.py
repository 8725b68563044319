"""Execute a notebook with papermill; keep the executed .ipynb and an HTML copy without code.

    python -m peercache.lab.analysis.papermill_run notebooks/report.ipynb reports/ \
        -p testbed peercache-8xcx7-roce -p tidy_dir data/reference

The kernel is "python3"; with ipykernel installed in the running interpreter's
environment, jupyter_client starts that kernel with this same interpreter, so
a fresh ``make setup`` venv needs no ``ipykernel install`` step.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from peercache import atomic

DEFAULT_KERNEL = "python3"


def _exporter(**kw):
    """nbconvert's HTMLExporter, rendering Markdown (cells and ``display(Markdown(...))`` outputs) with raw
    HTML escaped, ``javascript:`` links dropped and no local image embedded.

    The notebooks put hosts' and tools' text in their Markdown outputs (collect's findings carry each
    failed point's stderr); markup.md_text escapes it there, and this is the defence behind it, as
    markup.markdown_html is for report.html. nbconvert's own ``sanitize_html`` is no use here: its
    allowlist lacks th, thead, p and h1-h6, so it shows the tables and headings as tags.
    """
    # nbconvert (~2.5 s to import) and its jinja2: only rendering HTML needs them
    from jinja2 import pass_context
    from nbconvert import HTMLExporter  # ~2.5 s: only rendering HTML needs it
    from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath  # as HTMLExporter

    class Exporter(HTMLExporter):
        @pass_context                                  # as HTMLExporter's: the template hands it the cell
        def markdown2html(self, context, source):    # HTMLExporter's, with escape on (it passes False)
            cell = context.get("cell", {})
            renderer = IPythonRenderer(escape=True, allow_harmful_protocols=False,
                                       attachments=cell.get("attachments", {}), embed_images=False,
                                       path=context.get("resources", {}).get("metadata", {}).get("path", ""),
                                       anchor_link_text=self.anchor_link_text,
                                       exclude_anchor_links=self.exclude_anchor_links, **self.lexer_options)
            return MarkdownWithMath(renderer=renderer).render(source)

    return Exporter(**kw)


def to_html(ipynb: Path, html: Path) -> Path:
    """Render an executed notebook as HTML with every code cell's input hidden."""
    import nbformat  # ~1.5 s to import: only rendering HTML needs it
    from nbconvert.preprocessors import TagRemovePreprocessor  # nbconvert, ~2.5 s: likewise

    nb = nbformat.read(str(ipynb), as_version=4)
    exporter = _exporter(exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)
    # cells tagged for the notebook reader only (what the notebook does) stay out of the HTML
    exporter.register_preprocessor(TagRemovePreprocessor(remove_cell_tags={"remove-from-report"}, enabled=True),
                                   enabled=True)
    body, _ = exporter.from_notebook_node(nb)
    atomic.write_text(html, body)
    return html


def run_notebook(notebook, out_dir, parameters: dict[str, Any] | None = None, name: str | None = None,
                 kernel_name: str = DEFAULT_KERNEL, cwd=None, html: bool = True) -> tuple[Path, Path]:
    """Execute ``notebook`` into ``out_dir/<name>.ipynb`` and ``.html``; returns both paths.

    ``html=False``: the notebook writes its own HTML (the report does); only a failed run is rendered.
    """
    import papermill as pm  # ~2 s to import: only executing a notebook needs it

    notebook = Path(notebook)
    if not notebook.exists():
        raise FileNotFoundError(f"notebook {notebook} not found; the lab's notebooks are in notebooks/")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = name or notebook.stem
    ipynb, out_html = out_dir / f"{stem}.ipynb", out_dir / f"{stem}.html"
    try:
        pm.execute_notebook(str(notebook), str(ipynb), parameters=parameters or {},
                            kernel_name=kernel_name, cwd=str(cwd) if cwd else None,
                            progress_bar=False)
    except pm.PapermillExecutionError:
        # Keep an HTML of the failed run too: it shows which cell failed and why.
        if ipynb.exists():
            to_html(ipynb, out_html)
        raise
    return ipynb, (to_html(ipynb, out_html) if html else out_html)


def _parse_value(v: str) -> Any:
    return yaml.safe_load(v)


def main(argv: list[str] | None = None) -> int:
    """Command line: notebook, output folder, -p NAME VALUE ..."""
    ap = argparse.ArgumentParser(description="execute a notebook with papermill and render HTML without code")
    ap.add_argument("notebook")
    ap.add_argument("out_dir")
    ap.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                    help="notebook parameter (VALUE read as YAML: numbers, lists, null)")
    ap.add_argument("--name", help="output file stem (default: the notebook's)")
    ap.add_argument("--kernel", default=DEFAULT_KERNEL)
    ap.add_argument("--no-html", action="store_true", help="the notebook writes its own HTML (the report)")
    args = ap.parse_args(argv)
    params = {k: _parse_value(v) for k, v in args.parameter}
    ipynb, html = run_notebook(args.notebook, args.out_dir, params, args.name, args.kernel, html=not args.no_html)
    print(f"wrote {ipynb} and {html}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
