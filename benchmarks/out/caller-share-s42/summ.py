import json,glob,sys,collections
pre=sys.argv[1]
rows=collections.defaultdict(dict)
for f in sorted(glob.glob(f'/work/ab/{pre}*.json')):
    tag=f.split('/')[-1][len(pre):-5]
    for r in json.load(open(f)):
        if r['impl']!=tag: continue
        rows[r['bytes']][tag]=r['time_us']
tags=sorted({t for d in rows.values() for t in d})
print('bytes '+' '.join(f'{t:>14}' for t in tags))
for b in sorted(rows):
    print(f'{b:>5} '+' '.join(f'{rows[b].get(t,0):>14.1f}' for t in tags))
