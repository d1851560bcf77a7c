# Checks the geometry of an SVG file dtrain drew (scripts/plot-metrics,
# `dtrain topo --svg`) and exits 1 naming the first faults it finds:
#   - every <polyline> point lies inside the plot area: the rect with id
#     "plot-area", else the unfilled rect framing a chart (when it has curves);
#   - no two <text> labels' boxes overlap. A box is estimated from the font
#     size and the character count (0.6 em per character, 1 em tall, the
#     baseline at 0.8 em), honouring text-anchor and a rotate(+-90) transform.
# Prints one line per check with what it measured. Standard library only.
import re
import sys
import xml.etree.ElementTree as ET

SVG = "{http://www.w3.org/2000/svg}"
CHAR_EM, ASCENT_EM = 0.6, 0.8


def font_size(el, inherited):
    return float(el.get("font-size", inherited))


def text_box(el, size):
    text = "".join(el.itertext())
    x, y = float(el.get("x", 0)), float(el.get("y", 0))
    w, h = len(text) * size * CHAR_EM, size
    anchor = el.get("text-anchor", "start")
    left = x - (w / 2 if anchor == "middle" else w if anchor == "end" else 0)
    box = (left, y - ASCENT_EM * size, left + w, y + (1 - ASCENT_EM) * size)
    m = re.search(r"rotate\(\s*(-?90)\s+([-\d.]+)\s+([-\d.]+)\s*\)", el.get("transform", ""))
    if m:  # a quarter turn about (cx, cy): the box turns with it
        cx, cy = float(m.group(2)), float(m.group(3))
        corners = [(box[0], box[1]), (box[2], box[3])]
        sign = 1 if m.group(1) == "90" else -1
        pts = [(cx - sign * (py - cy), cy + sign * (px - cx)) for px, py in corners]
        box = (min(p[0] for p in pts), min(p[1] for p in pts), max(p[0] for p in pts), max(p[1] for p in pts))
    return text, box


def overlap(a, b):
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def main():
    root = ET.parse(sys.argv[1]).getroot()
    if root.tag != SVG + "svg":
        sys.exit(f"root element is {root.tag}, not svg")
    faults = []
    rects = list(root.iter(SVG + "rect"))
    area = next((r for r in rects if r.get("id") == "plot-area"), None)
    if area is None and root.findall(SVG + "polyline"):  # a chart's frame: the unfilled rect
        area = next((r for r in rects if r.get("fill") == "none"), None)
    points = 0
    if area is not None:
        x0, y0 = float(area.get("x")), float(area.get("y"))
        x1, y1 = x0 + float(area.get("width")), y0 + float(area.get("height"))
        for line in root.iter(SVG + "polyline"):
            for pair in line.get("points", "").split():
                px, py = (float(v) for v in pair.split(","))
                points += 1
                if not (x0 - 0.05 <= px <= x1 + 0.05 and y0 - 0.05 <= py <= y1 + 0.05):
                    faults.append(f"point ({px}, {py}) lies outside the plot area x {x0}..{x1}, y {y0}..{y1}")
        print(f"plot area x {x0}..{x1} y {y0}..{y1}: {points} points checked")
    base = float(root.get("font-size", 12))
    boxes = []
    for el in root.iter(SVG + "text"):
        boxes.append(text_box(el, font_size(el, base)))
    pairs = 0
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            pairs += 1
            if overlap(boxes[i][1], boxes[j][1]):
                a, b = boxes[i], boxes[j]
                faults.append(f"labels {a[0]!r} at {tuple(round(v, 1) for v in a[1])} and {b[0]!r} at "
                              f"{tuple(round(v, 1) for v in b[1])} overlap")
    print(f"{len(boxes)} text labels, {pairs} pairs checked")
    for f in faults[:10]:
        print("FAULT: " + f)
    if faults:
        sys.exit(f"{len(faults)} geometry fault(s) in {sys.argv[1]}")


if __name__ == "__main__":
    main()
