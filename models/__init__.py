"""The model factory: the embedded target/draft pair, from training to the served folders.

    recipe.py         the pair's training recipe: every knob, and its hash
    corpus.py         the corpus it trains on (Python code) and its tokenizer
    pair_training.py  the training run (`make models REBUILD=1`): target, distilled draft, checkpoints
    training.py       the one AdamW loop (the pair's training and distill's fine-tuning run it)
    widen.py          widen a trained Llama without changing what it computes (the cost-faithful target)
    embedded_pair.py  the shipped weights (embedded_weights/) -> the served pair, cached; its goals
    bigram_tables.py  the embedded pair's bigram table, and the command that builds one
    cache.py          specdeploy's cache folder
    cpu_dtype.py      whether this CPU computes bf16

deploy resolves `embedded:` models from here, tuning and distill use it; it imports nothing of
deploy, loadtest, tuning or distill (plugins only: the bigram table's format).
"""
