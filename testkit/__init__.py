"""Test support, not product code: a tiny Gemma 4 *trained* on a script of exchanges, so that tests
can tell a right answer from a wrong one. It is a 1.5 MB model made to test serving, not Gemma 4.

    from testkit import exchanges, trained
    folder = trained.ensure()                      # model folder to mount and serve (UID 2000 can read it)
    for ex in exchanges.EXCHANGES:                 # send ex.body(served_name) to ex.path, greedy
        problem = ex.mismatch(response_json)       # None when the answer is exactly the script

exchanges, media and trained.ensure() need only the standard library (ensure() copies the committed
fixture, as testkit.tiny_model.ensure() does for seed 0), so the quick start serves the model from
the build venv, which has no torch. `python -m testkit.train --fixture` remakes the weights.
"""
