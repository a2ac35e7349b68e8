#!/usr/bin/env python3
"""Independent reference for the pinned draw in test_sampler.cpp (SamplerDraw.MatchesPythonReference).

Re-implements, from the published algorithms and docs/sampling.md §4, the seeding (splitmix64), the stream
(xoshiro256**), next_double (top 53 bits * 2^-53) and the draw (walk the kept tokens in id order, return the first
whose cumulative weight exp((l - max) / T) exceeds u * total), with Python's own math.exp. Prints the tokens and
the smallest distance of any u * total from a boundary, relative to the total: Kestrel's weights are f32
(exp_portable, within 1 ulp), so it must stay far above 1e-6 for those differences not to matter.

Run: python3 tests/core/sampler/draw_reference.py
"""
import math
import struct

MASK = (1 << 64) - 1


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return state, z ^ (z >> 31)


def rotl(x, k):
    return ((x << k) | (x >> (64 - k))) & MASK


class Xoshiro256StarStar:
    def __init__(self, seed):
        self.s = []
        for _ in range(4):
            seed, value = splitmix64(seed)
            self.s.append(value)

    def next_u64(self):
        s = self.s
        result = (rotl((s[1] * 5) & MASK, 7) * 9) & MASK
        t = (s[1] << 17) & MASK
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return result

    def next_double(self):
        return (self.next_u64() >> 11) * 2.0**-53


def f32(v):
    return struct.unpack("f", struct.pack("f", v))[0]


def main():
    logits = [f32(v) for v in [0.25, -1.5, 2.0, 1.0, -0.5, 0.75, 1.75, -3.0]]
    temperature = 0.8
    rng = Xoshiro256StarStar(7)
    tokens, margin = [], 1.0
    for _ in range(32):
        u = rng.next_double()
        m = max(logits)
        weights = [math.exp((l - m) / temperature) for l in logits]
        total = sum(weights)
        target = u * total
        cumulative = 0.0
        for token, w in enumerate(weights):
            margin = min(margin, abs(cumulative - target) / total)
            cumulative += w
            if target < cumulative:
                margin = min(margin, (cumulative - target) / total)
                tokens.append(token)
                break
    print("tokens:", ", ".join(str(t) for t in tokens))
    print("smallest relative margin:", margin)


if __name__ == "__main__":
    main()
