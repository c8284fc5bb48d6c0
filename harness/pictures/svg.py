"""Drawing primitives: SVG elements as text, every value escaped. A tooltip is an SVG
``<title>``, which browsers show on hover without any script."""

from __future__ import annotations

from html import escape

# one palette for every picture: call kinds, ranks and states
COLOURS = {"collective": "#4c72b0", "send": "#dd8452", "recv": "#55a868", "wait": "#8172b3",
           "blocked": "#c44e52", "ended": "#937860", "grid": "#d8d8d8", "text": "#222222",
           "muted": "#777777", "F": "#4c72b0", "B": "#dd8452", "W": "#55a868",
           "BW": "#c44e52", "FB": "#8172b3", "params": "#4c72b0", "grads": "#dd8452",
           "optimizer": "#55a868", "gathered": "#8172b3"}
SERIES = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3",
          "#8c8c8c", "#ccb974", "#64b5cd")


def svg(width: float, height: float, body: list[str], label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
            f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="{escape(label)}">'
            + "".join(body) + "</svg>")


def rect(x: float, y: float, w: float, h: float, fill: str, tip: str = "", cls: str = "",
         stroke: str = "") -> str:
    attrs = f' class="{cls}"' if cls else ""
    attrs += f' stroke="{stroke}" stroke-width="2"' if stroke else ""
    inner = f"<title>{escape(tip)}</title>" if tip else ""
    return (f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 0.5):.1f}" height="{h:.1f}" '
            f'fill="{fill}"{attrs}>{inner}</rect>')


def line(x1: float, y1: float, x2: float, y2: float, colour: str, width: float = 1.0,
         dash: str = "", marker: str = "", tip: str = "") -> str:
    extra = f' stroke-dasharray="{dash}"' if dash else ""
    extra += f' marker-end="url(#{marker})"' if marker else ""
    inner = f"<title>{escape(tip)}</title>" if tip else ""
    return (f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{colour}" '
            f'stroke-width="{width}"{extra}>{inner}</line>')


def text(x: float, y: float, words: str, size: int = 12, anchor: str = "start",
         colour: str = COLOURS["text"], weight: str = "normal") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
            f'fill="{colour}" font-weight="{weight}">{escape(words)}</text>')


def polyline(points: list[tuple[float, float]], colour: str, tip: str = "",
             width: float = 2.0) -> str:
    inner = f"<title>{escape(tip)}</title>" if tip else ""
    coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    return (f'<polyline points="{coords}" fill="none" stroke="{colour}" '
            f'stroke-width="{width}">{inner}</polyline>')


def circle(x: float, y: float, r: float, fill: str, stroke: str, tip: str = "") -> str:
    inner = f"<title>{escape(tip)}</title>" if tip else ""
    return (f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" fill="{fill}" stroke="{stroke}" '
            f'stroke-width="2">{inner}</circle>')


def arrowhead(name: str, colour: str) -> str:
    return (f'<defs><marker id="{name}" viewBox="0 0 10 10" refX="10" refY="5" '
            f'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
            f'<path d="M 0 0 L 10 5 L 0 10 z" fill="{colour}"/></marker></defs>')


def legend(items: list[tuple[str, str]], x: float, y: float) -> list[str]:
    body, at = [], x
    for label, colour in items:
        body += [rect(at, y - 9, 10, 10, colour), text(at + 14, y, label, 11)]
        at += 22 + 7 * len(label)
    return body
