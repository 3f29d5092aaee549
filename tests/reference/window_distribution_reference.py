#!/usr/bin/env python3
"""An independent implementation of src/core/window_distribution.rs, written apart from it, for the
expected W values in the Rust tests (tests/cli_analyze.rs, tests/metrics_cases.rs,
tests/scrape_sources.rs, tests/controller_spec.rs, src/core/analysis.rs). A removal's window under
kube-proxy's busy runner: in a gap (probability m / (E[S] + m)) the rest of the gap, uniform on
[0, m], then its own sync S'; in a sync, the length-biased residual R of that sync (CDF
G(r) / E[S], G(r) = integral_0^r (1 - F)), then m, then S'. Buckets are piecewise uniform; S' is
averaged at K midpoints per bucket; the quantile by bisection (50 steps).

    python3 tests/reference/window_distribution_reference.py    # prints each case's W, seconds
"""
import bisect


def model_p99(buckets, m=1.0, q=0.99, K=8):
    """(W, E[S]) for `buckets` of (lower, upper, count) seconds and minSyncPeriod `m`."""
    CDF, mu, top = window_cdf(buckets, m, K)
    a,b=0.0,top+1
    for _ in range(50):
        c=(a+b)/2
        if CDF(c)>=q: b=c
        else: a=c
    return b, mu


def window_cdf(buckets, m=1.0, K=8):
    """(P(window <= x) as a function, E[S], the longest sync) for `buckets` and `m`."""
    tot=sum(c for _,_,c in buckets); bs=[(lo,hi,c/tot) for lo,hi,c in buckets if c>0]
    mu=sum(w*(lo+hi)/2 for lo,hi,w in bs)
    def F(t): return sum(w*(1.0 if hi==lo and t>=lo else min(max((t-lo)/(hi-lo),0),1) if hi>lo else 0) for lo,hi,w in bs)
    # G(r)=int_0^r (1-F)
    pts=sorted(set([0.0]+[x for lo,hi,_ in bs for x in (lo,hi)]))
    Gs=[0.0]
    for a,b in zip(pts,pts[1:]):
        Gs.append(Gs[-1]+(b-a)*(2-F(a+1e-12)-F(b-1e-12))/2)
    def G(r):
        if r<=0: return 0.0
        k=bisect.bisect_right(pts,r)-1
        if k>=len(pts)-1: return Gs[-1]+(r-pts[-1])*(1-F(pts[-1]))
        a=pts[k]; return Gs[k]+(r-a)*(2-F(a+1e-12)-F(r))/2
    pg=m/(mu+m); ps=mu/(mu+m)
    def FA(y):
        g=pg*min(max(y/m,0),1) if m>0 else 0
        return g+ps*min(G(y-m)/mu,1.0)
    def CDF(x):
        s=0
        for lo,hi,w in bs:
            for k in range(K):
                sv=lo+(hi-lo)*(k+0.5)/K
                s+=w/K*FA(x-sv)
        return s
    return CDF, mu, m+2*max(hi for _,hi,_ in bs)


def uniform_cdf(buckets, x):
    """P(D <= x) for `buckets` of (lower, upper, count), each spread evenly (a point mass when
    lower == upper)."""
    tot=sum(c for _,_,c in buckets)
    return sum(c/tot*(1.0 if x>=hi else 0.0 if x<=lo else (x-lo)/(hi-lo)) for lo,hi,c in buckets if c>0)


def coverage(sync, np, m, sleep, sync_known=1.0, np_known=1.0):
    """The share of a node's removal windows a sleep covers: min(P(window <= sleep), P(np <=
    sleep + 1 s)), each capped at the share of observations of known duration."""
    kp = min(window_cdf(sync, m)[0](sleep), sync_known) if sync else 1.0
    pr = min(uniform_cdf(np, sleep + 1.0), np_known) if np else 1.0
    return min(kp, pr)


def cum(pairs):
    """Classic cumulative (le, count) pairs to (lower, upper, count) buckets."""
    out=[];prev=0;pl=0
    for l,c in pairs:
        if c-prev>0: out.append((pl,l,c-prev))
        prev=c; pl=l
    return out

LES = [0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512]
CASES = {
    "v1.29 excerpt, m = 1 s": (cum(list(zip(LES[:9], [0, 0, 0, 0, 0, 1, 2, 4, 4]))), 1.0),
    "v1.29 excerpt, m = 5 s": (cum(list(zip(LES[:9], [0, 0, 0, 0, 0, 1, 2, 4, 4]))), 5.0),
    "v1.13 legacy microseconds": (cum(list(zip(LES, [1, 1, 1, 1, 24, 2534, 2660, 2668, 2668, 2669]))), 1.0),
    "v1.8 legacy excerpt": (cum(list(zip(LES, [1, 1, 1, 1, 1, 68, 290, 346, 362, 364]))), 1.0),
    "100 syncs in (0.128, 0.256]": ([(0.128, 0.256, 100)], 1.0),
    "6 syncs in (0.256, 0.512]": ([(0.256, 0.512, 6)], 1.0),
    "98 in (0, 0.05], 2 in (0.05, 0.07]": ([(0, 0.05, 98), (0.05, 0.07, 2)], 1.0),
    "98 in (0, 2], 2 in (2, 2.2]": ([(0, 2, 98), (2, 2.2, 2)], 1.0),
    "100 in (1.024, 2.048]": ([(1.024, 2.048, 100)], 1.0),
    "100 in (4.096, 8.192]": ([(4.096, 8.192, 100)], 1.0),
    "104 in (0, 0.1]": ([(0, 0.1, 104)], 1.0),
    "3 beyond 16.384 s (point mass)": ([(16.384, 16.384, 3)], 1.0),
}

# (sync buckets, network programming buckets, m, sleep, share of sync observations below +Inf)
COVERAGE_CASES = {
    "98 in (0, 2], 2 in (2, 2.2], m = 1 s, at 3 s": ([(0, 2, 98), (2, 2.2, 2)], [], 1.0, 3, 1.0),
    "98 in (0, 2], 2 in (2, 2.2], m = 1 s, at 4 s": ([(0, 2, 98), (2, 2.2, 2)], [], 1.0, 4, 1.0),
    "100 in (0.128, 0.256], NP 90 in (1, 2], 10 in (2, 4], at 2 s": ([(0.128, 0.256, 100)], [(1, 2, 90), (2, 4, 10)], 1.0, 2, 1.0),
    "v1.29 excerpt, m = 1 s, at 1 s": (cum(list(zip(LES[:9], [0, 0, 0, 0, 0, 1, 2, 4, 4]))), [], 1.0, 1, 1.0),
    "v1.8 legacy excerpt, 3 of 367 beyond 0.512 s, at 2 s": (cum(list(zip(LES, [1, 1, 1, 1, 1, 68, 290, 346, 362, 364]))) + [(0.512, 0.512, 3)], [], 1.0, 2, 364 / 367),
}

if __name__ == "__main__":
    for name, (buckets, m) in CASES.items():
        print(f"{name}: W = {model_p99(buckets, m)[0]:.6f} s")
    for name, (sync, np, m, sleep, known) in COVERAGE_CASES.items():
        print(f"coverage, {name}: {coverage(sync, np, m, sleep, known):.9f}")
