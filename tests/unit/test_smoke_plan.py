"""The smoke's plan: the checks kept out of the concurrent run name checks that exist."""

from gemma4_images import matrix, smoke

M = matrix.load()


def test_every_check_run_alone_is_a_planned_check():
    # A renamed check would otherwise drop out of ALONE silently and run batched with others.
    for target in M.targets:
        names = {name for name, _ in smoke.planned_checks(M, target, [], scripted=True)}
        assert smoke.ALONE <= names, (target, smoke.ALONE - names)
