# cmake -P script: install, then build a consumer program against the install twice: as a CMake
# project (find_package) and with the compiler alone, given pkg-config's flags.
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
endfunction()

file(REMOVE_RECURSE ${MT_SCRATCH})
set(prefix ${MT_SCRATCH}/prefix)
run(${CMAKE_COMMAND} --install ${MT_BUILD_DIR} --prefix ${prefix})

# The libraries carry their ABI version: libmt_core.so -> libmt_core.so.<SOVERSION> -> the file.
file(GLOB_RECURSE sonames LIST_DIRECTORIES false ${prefix}/libmt_core.so.${MT_SOVERSION})
if(NOT sonames)
  message(FATAL_ERROR "no libmt_core.so.${MT_SOVERSION} under ${prefix}: the libraries are not versioned")
endif()

run(${CMAKE_COMMAND} -S ${MT_CONSUMER_SOURCE} -B ${MT_SCRATCH}/build -G ${MT_GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix})
run(${CMAKE_COMMAND} --build ${MT_SCRATCH}/build)
run(${MT_SCRATCH}/build/consumer)
message(STATUS "consumer project built and ran against ${prefix} (find_package)")

# pkg-config: the same program, compiled and linked with the flags mixtrain.pc gives.
find_program(PKG_CONFIG pkg-config)
if(NOT PKG_CONFIG)
  message(FATAL_ERROR "pkg-config is not installed; it is needed to check mixtrain.pc")
endif()
file(GLOB_RECURSE pc_files LIST_DIRECTORIES false ${prefix}/mixtrain.pc)
list(LENGTH pc_files n_pc)
if(NOT n_pc EQUAL 1)
  message(FATAL_ERROR "expected one mixtrain.pc under ${prefix}, found ${n_pc}: ${pc_files}")
endif()
get_filename_component(pc_dir ${pc_files} DIRECTORY)
set(ENV{PKG_CONFIG_PATH} ${pc_dir})
execute_process(COMMAND ${PKG_CONFIG} --cflags --libs mixtrain RESULT_VARIABLE rc OUTPUT_VARIABLE pc_flags
                ERROR_VARIABLE err OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config --cflags --libs mixtrain failed (${rc}): ${err}")
endif()
execute_process(COMMAND ${PKG_CONFIG} --variable=libdir mixtrain OUTPUT_VARIABLE pc_libdir
                OUTPUT_STRIP_TRAILING_WHITESPACE)
message(STATUS "PKG_CONFIG_PATH=${pc_dir} pkg-config --cflags --libs mixtrain: ${pc_flags}")
separate_arguments(pc_args UNIX_COMMAND "${pc_flags}")
run(${MT_CXX_COMPILER} -std=c++17 ${MT_CONSUMER_SOURCE}/main.cpp ${pc_args} -Wl,-rpath,${pc_libdir}
    -o ${MT_SCRATCH}/consumer_pkg_config)
run(${MT_SCRATCH}/consumer_pkg_config)
message(STATUS "consumer program built with pkg-config's flags and ran against ${prefix}")
