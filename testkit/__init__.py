"""Test support, not product code: a tiny Gemma 4 *trained* on a script of exchanges, so that tests
can tell a right answer from a wrong one. It is a 1-2 MB model made to test serving, not Gemma 4."""
