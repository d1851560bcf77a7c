# Reads an SVG file with an XML parser (so a malformed file fails here) and
# prints, per <polyline>, one line: "polyline x1,y1 x2,y2 ...". Exits 1 when
# the root is not an <svg> element. Used by tests/integration/cli_test.cpp.
import sys
import xml.etree.ElementTree as ET

SVG = "{http://www.w3.org/2000/svg}"
root = ET.parse(sys.argv[1]).getroot()
if root.tag != SVG + "svg":
    sys.exit(f"root element is {root.tag}, not svg")
for line in root.iter(SVG + "polyline"):
    print("polyline " + line.get("points", ""))
