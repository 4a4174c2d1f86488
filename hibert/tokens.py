"""Special token ids, fixed for every SentencePiece model the platform trains (data_prep sets them,
modeling and the objectives rely on them). Pieces: <pad> <unk> <s> </s> [MASK] [SEP]."""
PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3
MASK_ID = 4
SEP_ID = 5
USER_DEFINED_SYMBOLS = ["[MASK]", "[SEP]"]  # get ids 4 and 5 after pad/unk/bos/eos
