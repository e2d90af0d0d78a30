cd /root/w; export CUDA_VISIBLE_DEVICES=1
echo "== $(date +%T) python3 -m assignment.trainer --config configs/gsm8k_qwen_coder_24gb.yaml --impl solutions/exercises.py train.output_dir=/root/r/24gb train.time_limit_s=null train.final_checkpoint=false "; python3 -m assignment.trainer --config configs/gsm8k_qwen_coder_24gb.yaml --impl solutions/exercises.py train.output_dir=/root/r/24gb train.time_limit_s=null train.final_checkpoint=false ; echo "== rc $?"
touch /root/r/done1
