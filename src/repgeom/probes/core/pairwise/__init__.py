"""Probes of two sets of states at once: `similarity` (each step against the final one, two texts
compared), `pairs` (the pairwise catalogue entries: CKA, mutual k-NN) and `null` (their
permutation null: a chance level and a p per pair)."""
