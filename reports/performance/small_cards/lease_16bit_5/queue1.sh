cd /root/w; export CUDA_VISIBLE_DEVICES=1
echo "== $(date +%T) python3 -m assignment.trainer --config configs/gsm8k_qwen_coder_16gb_float16.yaml --impl solutions/exercises.py train.output_dir=/root/r/16gb_float16 train.time_limit_s=null train.final_checkpoint=false "; python3 -m assignment.trainer --config configs/gsm8k_qwen_coder_16gb_float16.yaml --impl solutions/exercises.py train.output_dir=/root/r/16gb_float16 train.time_limit_s=null train.final_checkpoint=false ; echo "== rc $?"
touch /root/r/done1
