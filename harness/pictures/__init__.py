"""Pictures of a run: one self-contained HTML page (inline SVG and CSS, no script, nothing
fetched), for a person who looks before they read.

``page`` is the page and its style, ``svg`` the drawing primitives, and one module per
picture: ``timeline`` (each rank's calls), ``waitgraph`` (who waits for whom in a hang),
``charts`` (training curves, memory bars), ``gantt`` (pipeline schedules). ``reports``
puts them together for each command.

It imports ``models``, ``memory``, ``pipeline`` and ``checks``' hang analysis; only ``cli``
imports it.
"""
