"""nano's build tooling: make_model (corpus, tokenizer, pretraining, probe set), make_heldout, the card's probe."""
