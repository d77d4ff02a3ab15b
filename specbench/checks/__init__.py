"""Checks: does speculative greedy decoding reproduce plain greedy decoding (exactness), is speculative sampling
lossless, and what each acceptance rule shifts in the token distribution."""
