cd /root/w; export CUDA_VISIBLE_DEVICES=0
echo "== $(date +%T) python3 -m assignment.trainer --config configs/gsm8k_qwen_coder_16gb_float16.yaml --impl solutions/exercises.py train.output_dir=/root/r/16gb_float16_sampler_eval train.time_limit_s=null train.final_checkpoint=false eval.model=sampler"; python3 -m assignment.trainer --config configs/gsm8k_qwen_coder_16gb_float16.yaml --impl solutions/exercises.py train.output_dir=/root/r/16gb_float16_sampler_eval train.time_limit_s=null train.final_checkpoint=false eval.model=sampler; echo "== rc $?"
touch /root/r/done0
