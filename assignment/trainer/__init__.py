"""The PPO trainer (``ppo-train``) that the five exercises plug into. Given code: students run
it, they do not edit it.

One PPO step, top to bottom, is ``loop.ppo_step``; the modules it calls, in its order:

    data, synthetic    problems to train and evaluate on (GSM8K or generated arithmetic)
    rollout            render prompts, sample responses, log-probs and values at rollout time
    reward             score each response (GSM8K's '#### <number>' answer)
    ppo                the KL penalty and controller, and the epochs x minibatches update loop
    batch              the layout of a PPO batch: the response slice, padding trim, minibatches
    loop               ``train()``: a whole run, one ``ppo_step`` after another

and around them: ``config`` (typed config, one source of defaults), ``loading`` (tokenizer,
policy, reference), ``impl`` (whose exercises run: a module loaded by name or path),
``evaluate`` (greedy accuracy), ``runlog`` (what a run writes), ``checkpoint`` (exact resume),
``report`` and ``stats`` (the Markdown report), ``learning_check`` (does PPO with these
exercises learn?), ``cli`` and ``__main__`` (``python -m assignment.trainer`` is ``ppo-train``).
"""
