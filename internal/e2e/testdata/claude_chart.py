# Seed 000's first use case, as the scripted model's tool call runs it:
# per-category totals of a CSV of transactions and a bar chart PNG, with
# the standard library only.
import csv, struct, zlib
totals = {}
with open("context/transactions.csv", newline="") as f:
    for row in csv.DictReader(f):
        totals[row["category"]] = totals.get(row["category"], 0.0) + float(row["amount"])
with open("output/totals.csv", "w") as f:
    f.write("category,total\n")
    for k in sorted(totals):
        f.write("%s,%.2f\n" % (k, totals[k]))
w, h, top = 40 * len(totals), 100, max(totals.values())
rows = []
for y in range(h):
    row = bytearray([0])
    for k in sorted(totals):
        on = (h - y) <= totals[k] / top * h
        for x in range(40):
            row += bytes([30, 90, 200]) if on and 4 <= x < 36 else bytes([255, 255, 255])
    rows.append(bytes(row))
def chunk(t, d):
    return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(b"".join(rows))) + chunk(b"IEND", b"")
with open("output/chart.png", "wb") as f:
    f.write(png)
print("categories:", len(totals))
