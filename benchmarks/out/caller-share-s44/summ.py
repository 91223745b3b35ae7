# Per (case, size, build): each round's time (us) and rail 0's share, then the median.
import collections, glob, json, os, re, statistics, sys
d = collections.defaultdict(list)
for f in sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), sys.argv[1] if len(sys.argv) > 1 else "", "*.json"))):
    m = re.match(r"(.*-)?(seed|caller|check|check2|check3|check4)-(\d+)\.json", os.path.basename(f))
    if not m:
        continue
    for r in json.load(open(f)):
        d[(m.group(1) or "", r["bytes"], m.group(2))].append((r["time_us"], r["rails"][0]["share"]))
for key in sorted(d):
    runs = " / ".join(f"{t:.0f} ({s * 100:.0f}%)" for t, s in d[key])
    print(*key, runs, "median", round(statistics.median(t for t, _ in d[key])))
