"""fastai's nbs/examples/train_wt2.py as a user runs it (WikiText articles read into token lists, a vocabulary,
`Numericalize`, an AWD_LSTM language model, `ModelResetter`, `RNNRegularizer`, `accuracy` and `Perplexity`,
`fit_one_cycle`), with WikiText-2 replaced by generated articles of its layout (`example_data.wikitext_tiny`) and a
smaller model. fastai 2.8 has no `LM_Dataset`/`LM_Sampler`, which fastai's script used: its loaders are
`LMDataLoader`s over the same numericalized articles; `MixedPrecision(clip=0.1)` is `MixedPrecision()` and
`GradientClip(0.1)` (fastai 2.8's); `ModelResetter, RNNRegularizer(alpha, beta)` is `rnn_cbs(alpha, beta)`, which
adds fastai 2.8's `RNNCallback` between them; `Learner(dls, model, ...)` is fastai 2.8's order. fastai's script trains in
one process: the fit runs under `learn.distrib_ctx()`, with distrib.fastai's import; `report(learn)` added.
fastcore 2 has no `Param`: the arguments are fastcore 2's (`name:type=default, # help`).
Run: `python -m distrib.launch --nproc_per_node 2 tests/scripts/examples/train_wt2.py --epochs 2`"""
from fastai.basics import *
from fastai.text.all import *
from fastai.callback.all import *
from distrib.fastai import *
from fastcore.script import *
from example_data import wikitext_tiny, report

def istitle(line):
    return len(re.findall(r'^ = [^=]* = $', line)) != 0

def read_file(filename):
    articles = L()
    with open(filename, encoding='utf8') as f:
        lines = f.readlines()
    current_article = ''
    for i,line in enumerate(lines):
        current_article += line
        if i < len(lines)-2 and lines[i+1] == ' \n' and istitle(lines[i+2]):
            articles.append(current_article.split(' '))
            current_article = ''
    articles.append(current_article.split(' '))
    return articles

def get_data(bs, sl):
    path = rank0_first(wikitext_tiny)
    train, valid = read_file(path/'train.txt'), read_file(path/'valid.txt')
    count = Counter([p for t in train for p in t])
    vocab = make_vocab(count)
    train_ds = TfmdLists(train, tfms=Numericalize(vocab))
    valid_ds = TfmdLists(valid, tfms=Numericalize(vocab))
    train_dl = LMDataLoader(train_ds, bs=bs, seq_len=sl, shuffle=True, num_workers=0)
    valid_dl = LMDataLoader(valid_ds, bs=bs, seq_len=sl, num_workers=0)
    return DataLoaders(train_dl, valid_dl),vocab

@call_parse
def main(bs:int=8, # Batch size
         sl:int=12, # Sequence length
         epochs:int=2, # Number of epochs
        ):
    dls,vocab = get_data(bs, sl)
    config = awd_lstm_lm_config.copy()
    config.update({'input_p': 0.6, 'output_p': 0.4, 'weight_p': 0.5, 'embed_p': 0.1, 'hidden_p': 0.2,
                   'emb_sz': 16, 'n_hid': 24, 'n_layers': 2})
    model = get_language_model(AWD_LSTM, len(vocab), config=config)
    opt_func = partial(Adam, wd=0.1, eps=1e-7)
    alpha,beta = (3,2)
    cbs = [MixedPrecision(), GradientClip(0.1)] + rnn_cbs(alpha, beta)   # ModelResetter, RNNCallback, RNNRegularizer
    learn = Learner(dls, model, loss_func=CrossEntropyLossFlat(), opt_func=opt_func, cbs=cbs,
                    metrics=[accuracy, Perplexity()])
    with learn.distrib_ctx():
        learn.fit_one_cycle(epochs, 5e-3, moms=(0.8,0.7,0.8), div=10)
        report(learn, preds=False)
