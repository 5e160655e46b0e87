# Compiles tests/host/old_names.c (cmake -DCC=... -DSRC=... -DINC=... -P old_names.cmake): it must
# compile, and the compiler must name each old ifd_config field with its new name.
execute_process(COMMAND ${CC} -fsyntax-only -Wall -I${INC} ${SRC}
                RESULT_VARIABLE rc ERROR_VARIABLE out OUTPUT_VARIABLE out2)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "old_names.c does not compile:\n${out}")
endif()
foreach(pair "num_steps;steps" "watchdog_secs;watchdog"
             "initial_infeed_sleep_secs;initial_infeed_sleep" "max_loop_secs;max_loop_seconds")
  list(GET pair 0 old)
  list(GET pair 1 new)
  string(FIND "${out}" "ifd_config.${old} is renamed ifd_config.${new}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "no warning names ifd_config.${old} and ifd_config.${new}:\n${out}")
  endif()
endforeach()
