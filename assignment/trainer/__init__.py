"""The PPO trainer (``ppo-train``) that the five exercises plug into. Given code: students run
it, they do not edit it.

One PPO step, top to bottom, is ``loop.ppo_step``; the modules it calls, in its order:

    data, synthetic    problems to train and evaluate on (GSM8K or generated arithmetic)
    rollout            render prompts, sample responses, log-probs and values at rollout time
    reward             score each response (its last '#### <number>' or '\\boxed{<number>}' answer)
    ppo                the KL penalty and controller, the advantage guard, and the epochs x
                       minibatches update loop with its target_kl early stop
    batch              the layout of a PPO batch: the response slice, padding trim, minibatches
    loop               ``train()``: a whole run, one ``ppo_step`` after another

and around them: ``config`` (typed config, one source of defaults), ``loading`` (tokenizer,
policy, reference), ``impl`` (whose exercises run: a module loaded by name or path),
``evaluate`` (greedy accuracy, one record per problem), ``runlog`` (what a run writes, and when),
``checkpoint`` (exact resume), ``report`` and ``stats`` (the Markdown report, its summary.json,
the exact McNemar test), ``learning_check`` (does PPO with these exercises learn?), ``cli`` and
``__main__`` (``python -m assignment.trainer`` is ``ppo-train``).
"""
