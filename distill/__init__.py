"""Distil a draft from the deployed target on a user's own traffic (`make distill`).

    collect.py  the served target's continuations of the user's prompts, with its log-probabilities
    train.py    fine-tune the draft toward the target's distribution; teacher-forced evaluation
    data.py     the data file, its held-out split, and a built-in domain the embedded pair never saw
    fit.py      whether training fits this machine (memory, time), decided before any work
    run.py      check -> collect -> train -> write draft and config -> measure before and after
"""
