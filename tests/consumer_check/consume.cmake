# cmake -P script: install, then build a consumer project against the install.
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
endfunction()

file(REMOVE_RECURSE ${MT_SCRATCH})
set(prefix ${MT_SCRATCH}/prefix)
run(${CMAKE_COMMAND} --install ${MT_BUILD_DIR} --prefix ${prefix})
run(${CMAKE_COMMAND} -S ${MT_CONSUMER_SOURCE} -B ${MT_SCRATCH}/build -G ${MT_GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix})
run(${CMAKE_COMMAND} --build ${MT_SCRATCH}/build)
run(${MT_SCRATCH}/build/consumer)
message(STATUS "consumer project built and ran against ${prefix}")
