# cmake -DNPX=npx -DSRC=tools/web -DDIST=<dir> -DOUT=<file.cc> -P bundle.cmake
# Bundles the page with Vite (from the npm packages in SRC/node_modules) and embeds the result.
if(NOT IS_DIRECTORY ${SRC}/node_modules)
  message(FATAL_ERROR "tools/web/node_modules is missing: run scripts/setup.sh (it runs npm ci)")
endif()
execute_process(
  COMMAND ${NPX} --no-install vite build --logLevel warn --outDir ${DIST} --emptyOutDir
  WORKING_DIRECTORY ${SRC}
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "vite build failed (${rc})")
endif()
include(${CMAKE_CURRENT_LIST_DIR}/embed_assets.cmake)
