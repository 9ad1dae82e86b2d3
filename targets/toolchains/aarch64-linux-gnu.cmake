# Cross-compiling zobench-train for 64-bit Arm boards. Debian: apt-get install g++-aarch64-linux-gnu
# The core (-mcpu) comes from the board (harness/cpu.py), as ZOBENCH_CPU_FLAGS.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(ZOBENCH_STATIC ON CACHE BOOL "static binary" FORCE)
