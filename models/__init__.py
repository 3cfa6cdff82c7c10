"""The model factory: the embedded default's pair and the kit's code pair, from training to the served folders.

    smollm2.py        the embedded default's target (SmolLM2-135M-Instruct from the package index:
                      pinned wheel, GGUF conversion, logit check) and its served draft, cached
    draft_prompts.py  the prompts the draft trains on (chat, code questions, arithmetic, code starts)
    draft_training.py the draft's recipe: the target's answers with its log-probabilities, candidates
                      trained on them, the best one saved (`make models REBUILD=1`)

The code pair (the test suite's, `SPECDEPLOY_PAIR=plumbing`):
    recipe.py         the pair's training recipe: every knob, and its hash
    corpus.py         the corpus it trains on (Python code) and its tokenizer
    pair_training.py  the training run (`python -m models.embedded_pair --retrain`): target, draft, checkpoints
    training.py       the one AdamW loop (the pair's training and distill's fine-tuning run it)
    widen.py          widen a trained Llama without changing what it computes (the cost-faithful target)
    embedded_pair.py  the shipped weights (embedded_weights/) -> the served pair, cached; its goals
    bigram_tables.py  the embedded pair's bigram table, and the command that builds one
    cache.py          specdeploy's cache folder
    cpu_dtype.py      whether this CPU computes bf16

deploy resolves `embedded:` models from here, tuning and distill use it; it imports nothing of
deploy, loadtest, tuning or distill (plugins only: the bigram table's format).
"""
