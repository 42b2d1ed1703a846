from bench.sandbox_bench import main

main()
