import collections
import re
import sys

with open(sys.argv[1]) as raw:
    lines = [row.rsplit(" ", 1) for row in raw if row.strip()]
tot = collections.Counter()
self_ = collections.Counter()
incl = collections.Counter()
threads = collections.Counter()
mainlines = []
for stack, n in lines:
    n = int(n)
    frames = stack.split(";")
    threads[frames[0]] += n
    mainlines.append((frames, n))
# main thread = largest
main = threads.most_common(1)[0][0]
print(threads.most_common(5))
T = 0
for frames, n in mainlines:
    if frames[0] != main:
        continue
    T += n
    fr = frames[1:]
    if not fr:
        continue
    self_[fr[-1]] += n
    seen = set()
    for f in fr:
        key = re.sub(r" \(.*?:\d+\)$", lambda m: m.group(0).split(":")[0] + ")", f)
        if key not in seen:
            incl[key] += n
            seen.add(key)
print("main samples", T)
print("--- self top 40")
for f, n in self_.most_common(40):
    print(f"{100 * n / T:5.1f}% {f}")
print("--- inclusive top 60")
for f, n in incl.most_common(60):
    print(f"{100 * n / T:5.1f}% {f}")
