"""A report once explained, published: the hang's timing on the terminal, and the JSON and
HTML files where asked (``run``, ``run --fix``, ``analyze`` and ``attach`` alike)."""

from __future__ import annotations


def publish(record, result, command: str, report_path: str | None, html: str | None) -> int:
    """A report already explained: its hang timing, JSON and HTML where asked."""
    import time

    from distdoctor.cli.tables import hang_timing

    timing = hang_timing(record, time.monotonic()) if record.started else None
    if timing:
        print("\n" + timing)
    if report_path:
        result.write(report_path)
        print(f"\nwrote {report_path}")
    if html:
        from distdoctor.pictures import page, reports

        page.write(html, reports.script_page(record, result, command))
        print(f"\nwrote {html}")
    return 0 if result.status == "ok" else 1
